"""``attnkit classify``: label texts with a fine-tuned classifier."""

from __future__ import annotations

import argparse
import sys

from attnkit.cli.common import add_model_flag, input_lines, one_line, tokenizer_of


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "classify",
        help="label texts with a classifier (a BERT or GPT model with labels)",
        description="Print each text's most likely label, its probability and the text, tab-separated, one line\n"
        "per text (the TEXT arguments, else --input FILE or standard input, one per line).",
        epilog='example:\n  attnkit classify --model runs/testament "Blessed are the meek" "In the beginning"',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_flag(parser, "a classifier: a run of train.objective=classify, or a directory with labels")
    parser.add_argument("text", nargs="*", metavar="TEXT", help="texts to label")
    parser.add_argument("--input", metavar="FILE", help="texts, one per line, when no TEXT is given")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch

    import attnkit

    model = attnkit.from_pretrained(args.model)
    labels = model.config.labels
    if not labels:
        raise ValueError(
            f"{args.model} holds a {model.config.family} model without a classification head; "
            "fine-tune one with attnkit train --preset minilm-classify"
        )
    tokenizer_of(model, args.model, ids_hint=False)  # one line where the directory has none
    texts = list(input_lines(args, args.text))
    probabilities = torch.zeros(len(texts), len(labels))
    for batch, out, _ in model.batched(model.text_ids(texts)):
        probabilities[batch] = out.logits.float().softmax(-1)
    for text, p in zip(texts, probabilities, strict=True):
        best = int(p.argmax())
        sys.stdout.write(f"{labels[best]}\t{float(p[best]):.4f}\t{one_line(text)}\n")
    return 0
