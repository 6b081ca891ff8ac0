"""The ``attnkit`` command line. The only module that prints."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from attnkit import __version__


def _smoke(args: argparse.Namespace) -> int:
    from attnkit.smoke import FIRST_DIGIT, run_smoke

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


def _convert(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    import attnkit
    from attnkit.models.io import CONFIG, FORMAT

    source, target = Path(args.src), Path(args.dst)
    if target.exists() and (not target.is_dir() or any(target.iterdir())) and not args.force:
        raise FileExistsError(f"{target} already exists and is not empty; pass --force to replace it")
    to = args.to
    if to is None:  # the other side of the exchange
        is_ours = (source / CONFIG).exists() and json.loads((source / CONFIG).read_text()).get("format") == FORMAT
        to = "hf" if is_ours else "attnkit"
    model = attnkit.from_pretrained(source)
    if to == "hf":
        attnkit.export_hf(model, args.dst, overwrite=args.force)
    else:
        model.save_pretrained(args.dst, overwrite=args.force)
    print(f"wrote {args.dst} ({to} format, {model.config.family}, {model.num_parameters():,} parameters)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnkit", description=__doc__)
    parser.add_argument("--version", action="version", version=f"attnkit {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    smoke = sub.add_parser(
        "smoke",
        help="train a tiny encoder-decoder built from the blocks on string reversal",
        description="Train a tiny encoder-decoder built from attnkit.nn on digit-string "
        "reversal, decode held-out strings greedily with the KV cache, and check the cache "
        "against full recomputation.",
        epilog="example: attnkit smoke --steps 800",
    )
    smoke.add_argument("--steps", type=int, default=800, help="training steps (default 800)")
    smoke.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    smoke.add_argument("--quiet", action="store_true", help="no progress bar")
    smoke.set_defaults(run=_smoke)

    convert = sub.add_parser(
        "convert",
        help="convert a model directory between attnkit's format and Hugging Face's",
        description="Load SRC (attnkit's own directory, or a Hugging Face gpt2/bert/t5/marian directory "
        "with model.safetensors) and write it to DST in the other format, or the one --to names. "
        "Weights are read only from safetensors.",
        epilog="examples:\n"
        "  attnkit convert ./gpt2-hf ./gpt2-attnkit\n"
        "  attnkit convert ./my-run-model ./for-hf --to hf",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    convert.add_argument("src", help="directory to read")
    convert.add_argument("dst", help="directory to write (must not exist or be empty, unless --force)")
    convert.add_argument("--to", choices=["hf", "attnkit"], help="output format (default: the other one)")
    convert.add_argument("--force", action="store_true", help="replace a non-empty DST")
    convert.set_defaults(run=_convert)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, format="%(message)s")
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        if args.debug:
            raise
        print(f"attnkit: error: {err}", file=sys.stderr)
        return 2
