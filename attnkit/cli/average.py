"""``attnkit average``: average the weights of a run's last k checkpoints."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "average",
        help="average the weights of a run's last k checkpoints",
        description="Average the parameters of the last --last complete checkpoints of a run (the "
        "Transformer paper averages the last 5) and write an attnkit model directory.",
        epilog="example: attnkit average runs/mt --last 5 --out runs/mt-avg5",
    )
    parser.add_argument("run_dir", metavar="RUN", help="the run directory")
    parser.add_argument("--last", type=int, default=5, help="how many checkpoints (default 5)")
    parser.add_argument("--out", required=True, help="the model directory to write")
    parser.add_argument("--force", action="store_true", help="replace a non-empty --out")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from attnkit.training.average import average_checkpoints

    model, used = average_checkpoints(args.run_dir, args.last)
    model.save_pretrained(args.out, overwrite=args.force)
    print(f"averaged {len(used)} checkpoints ({', '.join(p.name for p in used)}) into {args.out}")
    return 0
