"""``attnkit figures``: run the chapter's experiments: figures and a measured REPORT.md."""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from attnkit.chapter import EXPERIMENTS
from attnkit.cli.common import require

if TYPE_CHECKING:
    from attnkit.chapter.report import Section


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "figures",
        help="run the chapter's experiments: figures and a measured REPORT.md",
        description="Regenerate every figure, property and table of the chapter from live code: the flow of "
        "attention, the 1/sqrt(d_k) variance argument, positional encodings and their rotation, the causal "
        "mask, attention heads of a trained translator, the complexity table measured, pre-LN vs post-LN, "
        "and the three families trained side by side. Writes PNGs, REPORT.md and report.json to --out.",
        epilog="examples:\n"
        "  attnkit figures --quick --out /tmp/chapter\n"
        "  attnkit figures --out chapter-report --model runs/translate-en-fr-20261130-0510\n"
        "  attnkit figures --only heads --model runs/translate-en-fr-20261130-0510 --out chapter-report",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", default="chapter-report", help="output directory (default chapter-report)")
    parser.add_argument("--quick", action="store_true", help="CI-sized shapes and budgets (about 2 minutes)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every random draw (default 0)")
    parser.add_argument("--model", metavar="RUN", help="a trained translator for the attention-heads section")
    parser.add_argument(
        "--only", nargs="+", choices=EXPERIMENTS, metavar="NAME",
        help=f"run only these ({', '.join(EXPERIMENTS)}); an earlier report in --out keeps the others",
    )  # fmt: skip
    parser.add_argument("--force", action="store_true", help="write into a non-empty --out")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    require("matplotlib")
    from pathlib import Path

    from attnkit.chapter.figures import check_output_dir, write_report
    from attnkit.chapter.report import Context

    out = Path(args.out)
    check_output_dir(out, args.force)
    names = args.only or EXPERIMENTS
    start = time.perf_counter()

    def done(name: str, section: Section, seconds: float) -> None:
        print(f"[{names.index(name) + 1}/{len(names)}] {section.title}: {seconds:.1f} s", flush=True)

    ctx = Context(out=out, quick=args.quick, seed=args.seed, model=args.model)
    report = write_report(ctx, names, on_section=done)
    print(f"wrote {report} and its figures in {time.perf_counter() - start:.0f} s")
    return 0
