"""``attnkit prepare``: tokenize a run's corpus once into a dataset store, as
``fairseq-preprocess`` does; ``attnkit train`` with the same data and tokenizer then starts
from it (and builds it itself where there is none)."""

from __future__ import annotations

import argparse
import time


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "prepare",
        help="tokenize a corpus once into a dataset store that training reuses",
        description="Read a run's corpus (a preset or config file, with any --section.key=value override), "
        "train its tokenizer and encode every example into a memory-mappable dataset store: flat token arrays "
        "with an index, per split, and a manifest. Stores live in $ATTNKIT_STORE (default "
        "~/.cache/attnkit/stores); a later `attnkit train` with the same data and tokenizer settings reuses it.",
        epilog="examples:\n"
        "  attnkit prepare --preset gpt-bible --data.corpus=files --data.path big.txt\n"
        "  attnkit train --preset gpt-bible --data.corpus=files --data.path big.txt --out runs/big",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", help="a run preset (its data section and tokenizer settings are used)")
    parser.add_argument("--config", help="a run config file (JSON or YAML)")
    parser.add_argument("--quiet", action="store_true", help="no progress")
    parser.set_defaults(run=run, accepts_overrides=True)


def run(args: argparse.Namespace) -> int:
    from attnkit.cli.train import run_config
    from attnkit.data.prepare import prepare

    config = run_config(args)
    start = time.perf_counter()
    tokenizer = None
    if config.train.init is not None:  # fine-tuning encodes with the pretrained model's own tokenizer
        from attnkit.training.run import init_model

        tokenizer = init_model(config).tokenizer  # type: ignore[union-attr]
    store = prepare(config, tokenizer, progress=not args.quiet)
    seconds = time.perf_counter() - start
    manifest = store.manifest
    size = sum(f["bytes"] for f in manifest["files"].values())
    print(f"dataset store: {store.directory}")
    for split, counts in manifest["splits"].items():
        if counts["examples"]:
            tokens = ", ".join(f"{side} {n:,}" for side, n in counts["tokens"].items())
            print(f"  {split}: {counts['examples']:,} examples, tokens: {tokens}")
    print(f"  {manifest['dtype']} ids, vocabulary {store.tokenizer.get_vocab_size():,}, {size / 1e6:.1f} MB on disk")
    text = manifest["text_bytes"] / 1e6
    if store.built:
        print(f"  built from {text:.1f} MB of text in {seconds:.1f} s ({text / max(seconds, 1e-9):.1f} MB/s)")
    else:
        print(f"  already prepared: checked and reused in {seconds:.1f} s")
    return 0
