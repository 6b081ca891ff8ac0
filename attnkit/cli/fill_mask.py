"""``attnkit fill-mask``: bERT: the top-k predictions for each [MASK] in a text."""

from __future__ import annotations

import argparse

from attnkit.cli.common import add_model_flag, tokenizer_of


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "fill-mask",
        help="BERT: the top-k predictions for each [MASK] in a text",
        description="Predict the tokens hidden behind [MASK] (or the tokenizer's own mask token) with a BERT "
        "model's masked-LM head.",
        epilog='example: attnkit fill-mask --model runs/bert "In the beginning God created the [MASK]."',
    )
    add_model_flag(parser, "a BERT model directory with its MLM head and tokenizer.json")
    parser.add_argument("text", nargs="+", help="texts holding one or more [MASK]")
    parser.add_argument("--top-k", type=int, default=5, help="predictions per mask (default 5)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import attnkit

    model = attnkit.from_pretrained(args.model)
    if model.config.family != "bert":
        raise ValueError(f"{args.model} holds a {model.config.family} model; fill-mask needs a BERT (masked LM)")
    if model.head is None:
        raise ValueError(f"{args.model} is a BERT without its MLM head (e.g. a sentence encoder); it cannot fill masks")
    if args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {args.top_k}")
    tokenizer = tokenizer_of(model, args.model, ids_hint=False)
    from attnkit.generation.fill_mask import fill_mask

    for text in args.text:
        print(text)
        for position, candidates in fill_mask(model, tokenizer, text, args.top_k):
            shown = ", ".join(f"{token!r} {p:.3f}" for token, p in candidates)
            print(f"  [MASK] #{position + 1}: {shown}")
    return 0
