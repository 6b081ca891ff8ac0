"""``attnkit bench``: the benchmark suite of a source checkout."""

from __future__ import annotations

import argparse
import os
import sys


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="the benchmark suite (from a source checkout): attnkit against transformers and torch.nn",
        description="Run one suite of benchmarks/ (python -m benchmarks): peak, forward, training, generation, "
        "latency, attention or translation; each case runs attnkit and its peer alternately in one process and "
        "prints the median and min-max of each, and their ratio.",
        epilog="examples:\n"
        "  attnkit bench peak\n"
        "  attnkit bench training --compile --out benchmarks/results/training-compiled.json\n"
        "  attnkit bench attention --small",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    parser.add_argument("suite_args", nargs=argparse.REMAINDER, help="the suite and its options (see --help)")
    parser.set_defaults(run=run, accepts_overrides=True)


def run(args: argparse.Namespace) -> int:
    if not os.path.isfile(os.path.join("benchmarks", "__main__.py")):
        raise ValueError(
            "attnkit bench runs the benchmarks/ folder of a source checkout: run it from the repository root"
        )
    sys.path.insert(0, os.getcwd())
    from benchmarks.__main__ import main as benchmarks_main

    sys.argv = ["attnkit bench", *args.suite_args, *args.overrides]
    benchmarks_main()
    return 0
