"""``attnkit smoke``: train a tiny encoder-decoder on digit-string reversal and check the KV cache."""

from __future__ import annotations

import argparse
import sys


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "smoke",
        help="train a tiny encoder-decoder built from the blocks on string reversal",
        description="Train a tiny encoder-decoder built from attnkit.nn on digit-string "
        "reversal, decode held-out strings greedily with the KV cache, and check the cache "
        "against full recomputation.",
        epilog="example: attnkit smoke --steps 800",
    )
    parser.add_argument("--steps", type=int, default=800, help="training steps (default 800)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from attnkit.smoke import FIRST_DIGIT, run_smoke

    if args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    result = run_smoke(steps=args.steps, seed=args.seed, progress=not args.quiet)
    digits = lambda ids: "".join(str(i - FIRST_DIGIT) for i in ids if i >= FIRST_DIGIT)  # noqa: E731
    src, out = result.example
    print(f"loss: {result.first_loss:.3f} -> {result.last_loss:.3f} over {args.steps} steps")
    print(f"held-out exact match (greedy, KV cache): {result.exact_match:.1%}")
    print(f"example: {digits(src)} -> {digits(out)}")
    print(f"cached decoding equals full recomputation: {result.cache_agrees}")
    print(f"total time: {result.seconds:.1f} s")
    if not result.cache_agrees or result.last_loss >= result.first_loss:
        print("error: the smoke run did not behave as the chapter says it should", file=sys.stderr)
        return 1
    return 0
