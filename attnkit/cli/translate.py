"""``attnkit translate``: translate lines with an encoder-decoder model."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from attnkit.cli.common import (
    add_decoding_flags,
    add_model_flag,
    add_weights_flag,
    compiles_so_far,
    count_input_lines,
    decoding_options,
    emit,
    in_batches,
    input_lines,
    load_for,
    one_line,
    report_compiles,
    say_choice,
    streamed,
    tokenizer_of,
)

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from attnkit.generation.options import DecodingOptions
    from attnkit.models import Model

# Batches sorted by length within windows of this many batches.
SORT_WINDOW = 16
PROGRESS_LINES = 1000  # an --input file this long shows its progress on stderr
# Where neither a flag nor the checkpoint's generation_config.json says: the paper's beam search.
DEFAULTS = dict(max_new_tokens=256, num_beams=4, length_penalty=0.6, length_penalty_style="gnmt")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "translate",
        help="translate lines with an encoder-decoder model (Transformer, Marian, T5)",
        description="Translate each source with an encoder-decoder model; print one line per source, in input\n"
        "order (an empty source gives an empty line), decoded with the directory's tokenizer.json, the\n"
        "start and special tokens skipped, newlines inside a text written as \\n. Sources are the TEXT\n"
        "arguments, else --input FILE, else standard input, one per line. A file is read 16 batches\n"
        "of --batch-size at a time, decoded in batches of similar length and printed in input order;\n"
        "a pipe or terminal is answered batch by batch, as soon as each batch has arrived. Each source\n"
        "ends with the end token, appended where the tokenizer does not add it (attnkit's translation\n"
        "objective trains on source + eos).\n"
        "Decoding flags left out take the checkpoint's generation_config.json values (a Hugging Face\n"
        "Marian's beams, length penalty and length); without one, the paper's (Vaswani et al. 2017,\n"
        "section 6.1): beam search with 4 beams, length penalty alpha = 0.6 in the gnmt form\n"
        "((5+|Y|)/6)^alpha. Every translation stops at source length + 50 tokens (--source-length-offset).",
        epilog="examples:\n"
        '  attnkit translate --model ./opus-mt-en-de "Attention is all you need."\n'
        "  attnkit translate --model ./opus-mt-en-de --batch-size 32 < news.en > news.de\n"
        "  attnkit translate --model ./my-run-model --num-beams 1 --input test.src",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_flag(parser)
    add_weights_flag(parser)
    parser.add_argument(
        "text", nargs="*", metavar="TEXT", help="sources to translate (default: --input FILE or standard input)"
    )
    parser.add_argument("--input", metavar="FILE", help="sources, one per line, when no TEXT is given")
    add_decoding_flags(parser, DEFAULTS)
    parser.add_argument(
        "--source-length-offset",
        type=int,
        default=50,
        metavar="N",
        help="stop each translation at its source length + N tokens (default 50, the paper's)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from attnkit.progress import ProgressReport

    model = load_for(args.model, "translate", args.weights)
    since = compiles_so_far()
    cfg = model.config
    options = decoding_options(args, model, DEFAULTS, source_length_offset=args.source_length_offset)
    tokenizer = tokenizer_of(model, args.model, ids_hint=False)
    eos = cfg.eos_token_id if args.eos_id is None else args.eos_id
    pad = cfg.pad_token_id if args.pad_id is None else args.pad_id
    total = count_input_lines(args) if args.input is not None and not args.text else 0
    texts, stream = input_lines(args, args.text), streamed(args, args.text)
    batches = args.batch_size, args.seed, stream, eos, pad
    progress = ProgressReport(total, "translate", unit="line", enabled=total >= PROGRESS_LINES)
    for lines in translate_lines(model, tokenizer, texts, options, *batches):
        emit(lines)
        progress.update(progress.n + len(lines))
    progress.close()
    say_choice(model)
    report_compiles(since)
    return 0


def translate_lines(
    model: Model, tokenizer: Tokenizer, texts: Iterable[str], options: DecodingOptions, batch_size: int,
    seed: int | None, stream: bool, eos: int | None, pad: int,
) -> Iterator[list[str]]:  # fmt: skip
    """Each window's outputs, in input order: ``texts`` read a window at a time (one batch when
    ``stream``), decoded in batches of similar length, each output cut at its source length +
    ``options.source_length_offset`` tokens (None: only at ``max_new_tokens``) and at the end
    token; an empty text gives an empty line. ``attnkit translate``, and ``attnkit generate`` on
    text-to-text models."""
    from attnkit.data.padding import length_sorted, pad_right
    from attnkit.generation.text import source_ids, until_eos

    offset, ends = options.source_length_offset, options.end_tokens(eos)
    window_size = batch_size * (1 if stream else SORT_WINDOW)
    for index, window in enumerate(in_batches(texts, window_size)):
        lines = [""] * len(window)
        rows = [n for n, text in enumerate(window) if text.strip()]
        sources = source_ids(tokenizer, eos, [window[n] for n in rows])
        rows, sources = [n for n, s in zip(rows, sources, strict=True) if s], [s for s in sources if s]
        for number, batch in enumerate(length_sorted([len(s) for s in sources], batch_size)):
            ids, mask = pad_right([sources[i] for i in batch], pad)
            batch_seed = None if seed is None else seed + index * SORT_WINDOW + number
            out = model.generate(ids, mask, options=options.but(seed=batch_seed))
            for row, i in enumerate(batch):
                # Drop the start token; keep at most source length + offset tokens, up to the end token.
                end = out.shape[1] if offset is None else 1 + len(sources[i]) + offset
                new = until_eos(out[row, 1:end].tolist(), ends)
                lines[rows[i]] = one_line(tokenizer.decode(new, skip_special_tokens=True))
        yield lines
