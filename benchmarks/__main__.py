"""``python -m benchmarks SUITE [--small] [--out FILE]``: run a suite, print a Markdown table.

Suites: ``forward`` (forward pass), ``generation`` (greedy and beam-4), ``latency`` (ms per
new token as the prefix grows), ``training`` (train steps and MFU), ``translation`` (BLEU at
equal wall time vs a MarianMT of the same size).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks import forward, generation, training, translation
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


def _translation(out: Path | None, small: bool, budget: float | None) -> str:
    curves = translation.run(small=small, budget=budget)
    names = list(curves)
    lines = [
        "### Greedy BLEU on 200 held-out verses against minutes of training (same data, batches, budget)",
        "",
        "| minutes | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for points in zip(*curves.values(), strict=False):
        lines.append(f"| {points[0][0]:.1f} | " + " | ".join(f"{bleu:.2f}" for _, bleu in points) + " |")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"machine": machine(), "curves": curves}, indent=2) + "\n")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("suite", choices=[*sorted(SUITES), "latency", "translation"])
    parser.add_argument("--small", action="store_true", help="tiny shapes (a quick check that it runs)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write the raw numbers as JSON")
    parser.add_argument("--budget", type=float, help="translation: seconds of training for each side")
    args = parser.parse_args()
    if args.suite == "latency":
        print(_latency(args.out, args.repeats))
        return
    if args.suite == "translation":
        print(_translation(args.out, args.small, args.budget))
        return
    run, title = SUITES[args.suite]
    print(report(title, run(repeats=args.repeats, small=args.small), args.out))


if __name__ == "__main__":
    main()
