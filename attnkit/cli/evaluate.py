"""``attnkit evaluate``: score a trained run on its held-out split."""

from __future__ import annotations

import argparse
import dataclasses
import math

from attnkit.cli.common import FLAGS, add_model_flag, add_no_repeat_ngram_flag, add_weights_flag, held_out, require
from attnkit.config import RunConfig


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="score a trained run on its held-out split (BLEU/chrF, accuracy/macro-F1, or loss and perplexity)",
        description="Evaluate a run directory's model on its corpus's held-out split: sacreBLEU BLEU and chrF "
        "for translation (per task for text-to-text runs), accuracy, macro-F1 and the confusion matrix for "
        "classifiers, loss, perplexity and accuracy for the language models.",
        epilog="example: attnkit evaluate --model runs/translate-en-fr --split test --num-beams 4",
    )
    add_model_flag(parser, "a run directory (written by attnkit train)")
    add_weights_flag(parser, default="fp32")
    parser.add_argument("--split", choices=["valid", "test"], default="test", help="held-out split (default test)")
    parser.add_argument("--num-beams", type=int, default=4, help="beam size for translation (default 4; 1 = greedy)")
    parser.add_argument("--length-penalty", type=float, default=0.6, help="GNMT α for beam search (default 0.6)")
    add_no_repeat_ngram_flag(parser)
    parser.add_argument("--confusion-png", metavar="FILE", help="classifiers: draw the confusion matrix into FILE")
    parser.set_defaults(run=run)


# The command's steps in the order it prints them (load, encode, score each split, per task,
# the report); each step is a call into the library, the length is their sequence.
def run(args: argparse.Namespace) -> int:
    import attnkit
    from attnkit.data.prepare import encode
    from attnkit.data.tokenizer import specials_of
    from attnkit.generation.options import DecodingOptions
    from attnkit.models.run_dir import read_run_config
    from attnkit.training.evaluate import evaluate
    from attnkit.training.report import by_task, score_translations
    from attnkit.training.run import make_objective

    saved = read_run_config(args.model)[0]
    pairs = held_out(saved, args.split)
    model = attnkit.from_pretrained(args.model, weights=args.weights)
    if saved.objective == "translation":
        require("sacrebleu")
        options = {"num_beams": args.num_beams, "no_repeat_ngram_size": args.no_repeat_ngram_size}
        if args.no_repeat_ngram_unit is not None:
            options["no_repeat_ngram_unit"] = args.no_repeat_ngram_unit
        if args.num_beams > 1:
            options.update(length_penalty=args.length_penalty, length_penalty_style="gnmt")
        DecodingOptions.named(FLAGS, {}, **options)  # refused here, naming its flag, before any decoding
        scores = score_translations(model, model.tokenizer, pairs, saved.data.max_tokens, **options)
        result = f"BLEU {scores.bleu:.2f}, chrF {scores.chrf:.2f}"
        print(f"{args.split}: {len(pairs)} sentences, beam {args.num_beams}: {result}")
        if saved.data.tasks:  # text-to-text runs: each task's own score, beside copying the source
            for task, own in by_task(pairs, scores.hypotheses).items():
                print(
                    f"  {task}: {own.sentences} sentences: BLEU {own.bleu:.2f}, chrF {own.chrf:.2f} (copying the "
                    f"source: BLEU {own.copy_bleu:.2f}); {own.new_repeats} outputs repeat a 3-gram"
                )
        print(f"  {scores.signature}")
        return 0
    if saved.objective == "classify":
        from attnkit.data.prepare import encode_labeled
        from attnkit.training.evaluate import classification_scores

        labels = model.config.labels
        examples = encode_labeled(model.tokenizer, pairs, labels, saved.data.max_tokens)
        scores = classification_scores(model, examples, len(labels))
        print(f"{args.split}: {len(examples)} examples: accuracy {scores['accuracy']:.4f}, "
              f"macro-F1 {scores['macro_f1']:.4f}")  # fmt: skip
        width = max(len(name) for name in labels)
        print(f"  confusion (rows: true, columns: predicted; {', '.join(labels)}):")
        for name, row in zip(labels, scores["confusion"], strict=True):
            print(f"  {name:>{width}}  " + "  ".join(f"{n:6d}" for n in row))
        if args.confusion_png:
            from pathlib import Path

            from attnkit.training.report import plot_confusion

            require("matplotlib")
            accuracy, f1 = scores["accuracy"], scores["macro_f1"]
            title = f"{Path(args.model).name}, {args.split} split\naccuracy {accuracy:.1%}, macro-F1 {f1:.3f}"
            print(f"  drawn: {plot_confusion(scores['confusion'], labels, Path(args.confusion_png), title)}")
        return 0
    examples = encode(model.tokenizer, pairs, saved.data.max_tokens)
    objective = make_objective(saved, specials_of(model.tokenizer))
    everything = RunConfig(saved.model, dataclasses.replace(saved.train, eval_batches=len(examples)), saved.data)
    result = evaluate(model, objective, examples, everything)
    shown = ", ".join(f"{k} {v:.4g}" for k, v in result.items() if isinstance(v, float) and math.isfinite(v))
    print(f"{args.split}: {len(examples)} examples, {result['tokens']} target tokens: {shown}")
    return 0
