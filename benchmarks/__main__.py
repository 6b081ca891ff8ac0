"""``python -m benchmarks SUITE [--small] [--out FILE]``: run a suite, print a Markdown table.

Suites: ``forward`` (forward pass), ``generation`` (greedy and beam-4), ``latency`` (ms per
new token as the prefix grows), ``training`` (train steps and MFU).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks import forward, generation, training
from benchmarks.common import machine, report

SUITES = {
    "forward": (forward.run, "Forward throughput, fp32, identical weights"),
    "generation": (generation.run, "Generation throughput, fp32, identical weights"),
    "training": (training.run, "Training step throughput (forward, backward, AdamW), fp32, identical weights"),
}


def _latency(out: Path | None, repeats: int) -> str:
    table = generation.per_token_latency(repeats=repeats)
    lines = [
        "### Milliseconds per new token after a prefix (greedy, batch 1, d=256, 4 layers)",
        "",
        "| prefix | attnkit ms/token | transformers ms/token |",
        "|---|---|---|",
        *(f"| {p} | {row['attnkit']:.2f} | {row['transformers']:.2f} |" for p, row in table.items()),
    ]
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"machine": machine(), "ms_per_token": table}, indent=2) + "\n")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("suite", choices=[*sorted(SUITES), "latency"])
    parser.add_argument("--small", action="store_true", help="tiny shapes (a quick check that it runs)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write the raw numbers as JSON")
    args = parser.parse_args()
    if args.suite == "latency":
        print(_latency(args.out, args.repeats))
        return
    run, title = SUITES[args.suite]
    print(report(title, run(repeats=args.repeats, small=args.small), args.out))


if __name__ == "__main__":
    main()
