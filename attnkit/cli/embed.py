"""``attnkit embed`` and ``attnkit search``: an encoder model's sentence embeddings, and a
semantic search over the Bible's verses with them."""

from __future__ import annotations

import argparse
import json
import sys

from attnkit.cli.common import add_model_flag, input_lines


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    embed = subparsers.add_parser(
        "embed",
        help="sentence embeddings of texts with an encoder (BERT-family) model, as JSON lines",
        description="Embed each text (the TEXT arguments, else --file FILE or standard input, one per line) with\n"
        "an encoder model: its last hidden states averaged over the real tokens, unit length (as\n"
        "sentence-transformers pools all-MiniLM-L6-v2). One JSON object per line: {text, embedding}.",
        epilog='example:\n  attnkit embed --model ./all-MiniLM-L6-v2 "The quick brown fox jumps over the lazy dog."',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_flag(embed, "an encoder (BERT-family) model directory with its tokenizer")
    embed.add_argument("text", nargs="*", metavar="TEXT", help="texts to embed")
    embed.add_argument("--file", dest="input", metavar="FILE", help="texts, one per line, when no TEXT is given")
    embed.add_argument("--no-normalize", action="store_true", help="keep the mean's length (default: unit vectors)")
    embed.add_argument("--batch-size", type=int, default=32, metavar="N", help="texts encoded together (32)")
    embed.set_defaults(run=run_embed)

    search = subparsers.add_parser(
        "search",
        help="semantic search over the Bible's verses with an encoder model's embeddings",
        description="Find the verses nearest to each QUERY by the cosine of their embeddings. The corpus is\n"
        "embedded once and cached (embeddings.safetensors beside index.json, under --cache); a later\n"
        "search with the same model and corpus reads the cache instead of embedding it again.",
        epilog="examples:\n"
        '  attnkit search --model ./all-MiniLM-L6-v2 --corpus bible "love your enemies"\n'
        '  attnkit search --model ./all-MiniLM-L6-v2 --corpus bible --book Psalms --top-k 3 "the Lord is my shepherd"',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_flag(search, "an encoder (BERT-family) model directory with its tokenizer")
    search.add_argument("query", nargs="+", metavar="QUERY", help="what to look for")
    search.add_argument("--corpus", choices=["bible"], default="bible", help="what to search (bible)")
    search.add_argument(
        "--translation", default="4", metavar="CODE", help="the Bible: 4 World English (default), k KJV"
    )
    search.add_argument("--book", action="append", metavar="NAME", help="only these books (repeatable), e.g. Matthew")
    search.add_argument("--top-k", type=int, default=5, metavar="K", help="verses shown per query (5)")
    search.add_argument("--cache", metavar="DIR", help="the embeddings cache (default ~/.cache/attnkit/search)")
    search.add_argument("--batch-size", type=int, default=64, metavar="N", help="verses encoded together (64)")
    search.set_defaults(run=run_search)


def _encoder(directory: str):  # type: ignore[no-untyped-def]
    import attnkit

    model = attnkit.from_pretrained(directory)
    if model.config.family != "bert":
        raise ValueError(
            f"{directory} holds a {model.config.family} model; sentence embeddings need an encoder (BERT-family) "
            "model, e.g. all-MiniLM-L6-v2"
        )
    if model.tokenizer is None:
        raise ValueError(f"{directory} has no tokenizer, so text cannot be read; put its tokenizer files there")
    return model


def run_embed(args: argparse.Namespace) -> int:
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    model = _encoder(args.model)
    texts = list(input_lines(args, args.text))
    vectors = model.encode(texts, normalize=not args.no_normalize, batch_size=args.batch_size)
    for text, vector in zip(texts, vectors.tolist(), strict=True):
        sys.stdout.write(json.dumps({"text": text, "embedding": [round(x, 6) for x in vector]}) + "\n")
    return 0


def run_search(args: argparse.Namespace) -> int:
    from pathlib import Path

    from attnkit.data.corpora import bible_verses
    from attnkit.tasks.search import cached, default_cache

    if args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {args.top_k}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    model = _encoder(args.model)
    verses = bible_verses(args.translation, args.book)
    name = f"bible-{args.translation}" + (
        "" if not args.book else "-" + "-".join(b.replace(" ", "") for b in args.book)
    )
    cache = Path(args.cache) if args.cache else default_cache()
    index, reused = cached(model, verses, name, cache, args.batch_size)
    if not reused:
        print(f"embedded {len(verses)} verses once; cached under {cache}", file=sys.stderr)
    for query, hits in zip(args.query, index.search(model, args.query, args.top_k), strict=True):
        if len(args.query) > 1:
            print(f"# {query}")
        for hit in hits:
            print(f"{hit.score:.4f}  {hit.reference}  {hit.text}")
    return 0
