"""``python -m benchmarks forward [--small] [--out FILE]``: run a suite, print a Markdown table."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks import forward
from benchmarks.common import report

SUITES = {"forward": (forward.run, "Forward throughput, fp32, identical weights")}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument("--small", action="store_true", help="tiny shapes (a quick check that it runs)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, help="write the raw numbers as JSON")
    args = parser.parse_args()
    run, title = SUITES[args.suite]
    print(report(title, run(repeats=args.repeats, small=args.small), args.out))


if __name__ == "__main__":
    main()
