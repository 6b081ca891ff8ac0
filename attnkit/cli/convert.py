"""``attnkit convert``: convert a model directory between attnkit's format and Hugging Face's."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="convert a model directory between attnkit's format and Hugging Face's",
        description="Load SRC (attnkit's own directory, a Hugging Face gpt2/llama/bert/t5/marian directory "
        "with model.safetensors, or a Llama GGUF file) and write it to DST in the other format, or the one "
        "--to names (a GGUF file becomes attnkit's directory, its blocks dequantised to fp32, its tokenizer "
        "as tokenizer.json). Weights are read only from safetensors or GGUF.",
        epilog="examples:\n"
        "  attnkit convert ./gpt2-hf ./gpt2-attnkit\n"
        "  attnkit convert SmolLM2-135M-Instruct.Q4_1.gguf ./smollm2\n"
        "  attnkit convert ./my-run-model ./for-hf --to hf",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("src", help="directory (or .gguf file) to read")
    parser.add_argument("dst", help="directory to write (must not exist or be empty, unless --force)")
    parser.add_argument("--to", choices=["hf", "attnkit"], help="output format (default: the other one)")
    parser.add_argument("--force", action="store_true", help="replace a non-empty DST")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
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
        to = "hf" if is_ours else "attnkit"  # a GGUF file is not ours: it becomes attnkit's directory
    model = attnkit.from_pretrained(source)
    if to == "hf":
        attnkit.export_hf(model, args.dst, overwrite=args.force)
    else:
        model.save_pretrained(args.dst, overwrite=args.force)
    print(f"wrote {args.dst} ({to} format, {model.config.family}, {model.num_parameters():,} parameters)")
    return 0
