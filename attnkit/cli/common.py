"""What the commands share: loading a model for a command, the decoding flags and their checks,
reading inputs line by line, batching, and printing one line per input.

Nothing here imports torch at module level: parsing and ``--help`` stay instant.
"""

from __future__ import annotations

import argparse
import importlib
import os
import stat
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from attnkit.config import RunConfig

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from attnkit.generation.options import DecodingOptions
    from attnkit.models import Model

_T = TypeVar("_T")


def add_weights_flag(parser: argparse.ArgumentParser, default: str = "auto") -> None:
    parser.add_argument(
        "--weights", choices=["auto", "fp32", "bf16", "int8", "int4", "gguf"], default=default,
        help="weight format for inference: auto (the fastest this CPU runs for the command whose perplexity on the "
        "model's check stays within the documented bound, said on stderr), fp32 as trained, bf16 (CPUs with native "
        "bf16), int8, int4 (4-bit blocks), gguf (a .gguf file's own blocks); one this CPU cannot run fast falls "
        f"back, saying so (default {default})",
    )  # fmt: skip


def load_model(directory: str, weights: str, job: str | None = None) -> Model:
    """The model of ``directory`` in ``weights`` format; ``auto`` chooses it for ``job``
    (:func:`attnkit.loading.load_auto`; :func:`say_choice` says what it chose and why)."""
    import attnkit
    from attnkit.loading import load_auto
    from attnkit.machine import keep_freed_memory, release_freed_memory

    keep_freed_memory()  # this process decodes: reuse its large blocks (see keep_freed_memory)
    if weights != "auto":
        model = attnkit.from_pretrained(directory, weights=weights)
    else:
        model, choice = load_auto(directory, job)  # type: ignore[arg-type]
        model._weights_choice = f"weights auto: {choice.weights}, {choice.reason}"  # for say_choice
    release_freed_memory()  # what the load held for a while: not the decoding's to keep
    return model


def say_choice(model: Model) -> None:
    """On stderr, once, after a command's work: the format ``--weights auto`` chose and why
    (after, so that an error stays the one line it is)."""
    choice = model.__dict__.pop("_weights_choice", None)
    if choice is not None:
        print(choice, file=sys.stderr)


def load_for(directory: str, command: str, weights: str = "auto") -> Model:
    """The model of ``directory`` in ``weights`` format (``auto``: chosen for ``command``'s job),
    refused with a pointer to the right command when its family does not fit ``command``."""
    model = load_model(directory, weights, "translate" if command == "translate" else "decode")
    cfg = model.config
    if cfg.family == "bert":
        raise ValueError(
            f"{directory} holds a BERT encoder, which does not {command}; use attnkit fill-mask for [MASK] predictions"
        )
    if command == "translate" and not cfg.is_encoder_decoder:
        raise ValueError(
            f"{directory} holds a decoder-only ({cfg.family}) model; translate needs an encoder-decoder, "
            f"use: attnkit generate --model {directory}"
        )
    return model


def tokenizer_of(model: Model, directory: str, ids_hint: bool) -> Tokenizer:
    tokenizer = model.tokenizer
    if tokenizer is None:
        hint = ', or pass token ids with --ids "1 2 3"' if ids_hint else ""
        raise ValueError(
            f"{directory} has no tokenizer.json, so text cannot be encoded; put the model's tokenizer.json there "
            f"(save_pretrained writes model.tokenizer){hint}"
        )
    return tokenizer


# The decoding flags a checkpoint's generation_config.json may set instead (max_length counts
# for --max-new-tokens).
FILE_DEFAULTED = ("max_new_tokens", "num_beams", "length_penalty", "length_penalty_style", "no_repeat_ngram_size")
# Each decoding option's flag: an option out of its range is refused naming the flag typed.
FLAGS = {
    "max_new_tokens": "--max-new-tokens", "num_beams": "--num-beams", "length_penalty": "--length-penalty",
    "length_penalty_style": "--length-penalty-style", "do_sample": "--do-sample", "temperature": "--temperature",
    "top_k": "--top-k", "top_p": "--top-p", "seed": "--seed", "eos_token_id": "--eos-id", "pad_token_id": "--pad-id",
    "no_repeat_ngram_size": "--no-repeat-ngram-size", "no_repeat_ngram_unit": "--no-repeat-ngram-unit",
    "source_length_offset": "--source-length-offset", "compile": "--compile",
}  # fmt: skip


def decoding_options(
    args: argparse.Namespace, model: Model, fallback: dict[str, object], **more: object
) -> DecodingOptions:
    """The decoding flags (and ``more`` options, such as a grammar) as one
    :class:`~attnkit.generation.options.DecodingOptions`, an option out of its range refused
    naming its flag. A flag left out is left to the checkpoint's ``generation_config.json``
    where that sets it (``model.generation_defaults``); the lengths, beams and penalty of
    :data:`FILE_DEFAULTED` else take ``fallback`` (the command's own defaults). Sampling is
    asked for by ``--do-sample`` only, which without ``--num-beams`` samples one path."""
    from attnkit.generation.options import DecodingOptions

    file = model.generation_defaults
    given = {key: getattr(args, key) for key in FILE_DEFAULTED}
    if args.do_sample and given["num_beams"] is None:
        given["num_beams"] = 1
    in_file = {key: key in file or (key == "max_new_tokens" and "max_length" in file) for key in FILE_DEFAULTED}
    options = {k: fallback.get(k) if v is None else v for k, v in given.items() if v is not None or not in_file[k]}
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    sampling = {"--temperature": args.temperature, "--top-k": args.top_k, "--top-p": args.top_p}
    set_without_sampling = [flag for flag, value in sampling.items() if value is not None]
    if set_without_sampling and not args.do_sample:
        verb = "applies" if len(set_without_sampling) == 1 else "apply"
        raise ValueError(f"{', '.join(set_without_sampling)} {verb} only when sampling; add --do-sample")
    for flag, value in [("--eos-id", args.eos_id), ("--pad-id", args.pad_id)]:
        if value is not None and not 0 <= value < model.config.vocab_size:
            raise ValueError(f"{flag} must be a token id in [0, {model.config.vocab_size}), got {value}")
    flagged = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, eos_token_id=args.eos_id,
                   pad_token_id=args.pad_id, no_repeat_ngram_unit=args.no_repeat_ngram_unit)  # fmt: skip
    flagged = {key: value for key, value in flagged.items() if value is not None}
    return DecodingOptions.named(
        FLAGS, file, **options, **flagged, do_sample=args.do_sample, compile=compile_option(args), **more
    )


def compiles_so_far() -> int:
    """How many decoding steps this process has compiled or loaded: a command's
    :func:`report_compiles` reports those after it."""
    from attnkit.generation.compiled import COMPILES

    return len(COMPILES)


def report_compiles(since: int) -> int:
    """On stderr: each decoding step compiled or loaded (from the ``since``-th on), and the
    seconds it took. Returns how many have been compiled, the next call's ``since``."""
    from attnkit.generation.compiled import COMPILES

    for done in COMPILES[since:]:
        how = "loaded" if done.loaded else "compiled"
        print(f"{how} the decoding step ({done.what}) in {done.seconds:.1f} s", file=sys.stderr)
    return len(COMPILES)


def add_decoding_flags(parser: argparse.ArgumentParser, fallback: dict[str, object]) -> None:
    """The decoding flags; those of ``FILE_DEFAULTED`` default to the checkpoint's
    ``generation_config.json``, else to ``fallback``."""
    group = parser.add_argument_group(
        "decoding", "flags left out take the checkpoint's generation_config.json values, else the defaults below"
    )
    group.add_argument(
        "--max-new-tokens",
        metavar="N",
        type=int,
        help=f"most tokens generated (default {fallback['max_new_tokens']})",
    )
    group.add_argument(
        "--num-beams",
        metavar="K",
        type=int,
        help=f"beams; 1 = greedy (default {fallback['num_beams']}, or 1 with --do-sample)",
    )
    group.add_argument(
        "--length-penalty",
        metavar="ALPHA",
        type=float,
        help=f"length penalty alpha for beam search; 0 = none (default {fallback['length_penalty']})",
    )
    group.add_argument(
        "--length-penalty-style",
        choices=["gnmt", "power"],
        help="gnmt: ((5+|Y|)/6)^alpha, the paper's; power: |Y|^alpha, Hugging Face's "
        f"(default {fallback['length_penalty_style']})",
    )
    add_no_repeat_ngram_flag(group)
    group.add_argument("--do-sample", action="store_true", help="sample instead of taking the most likely token")
    group.add_argument(
        "--temperature",
        metavar="T",
        type=float,
        help="sampling temperature > 0 (default: the checkpoint's generation_config.json, else 1.0)",
    )
    group.add_argument("--top-k", metavar="K", type=int, help="sample among the k most likely tokens")
    group.add_argument(
        "--top-p", metavar="P", type=float, help="sample from the smallest set of tokens with mass >= p, in (0, 1]"
    )
    group.add_argument(
        "--seed", metavar="S", type=int, help="sampling seed, for reproducible samples (batch i uses seed + i)"
    )
    group.add_argument(
        "--eos-id", metavar="ID", type=int, help="end-of-sequence token id (default: the model config's)"
    )
    group.add_argument("--pad-id", metavar="ID", type=int, help="padding token id (default: the model config's)")
    add_compile_flag(group, "many inputs")
    parser.add_argument("--batch-size", metavar="N", type=int, default=16, help="inputs decoded together (default 16)")


def add_compile_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup, pays_off_over: str) -> None:
    parser.add_argument(
        "--compile", action=argparse.BooleanOptionalAction, default=None,
        help="run the decoding step (greedy, sampled or beam search) as one compiled graph (torch.compile) from the "
        "first step: "
        "each new batch shape and cache size is loaded from the compile cache (seconds) or compiled (seconds to a "
        f"minute, reported), so it pays off over {pays_off_over}. Default: eager until the eager seconds of a "
        "shape reach what its step costs, then compiled (a short job is never slower); --no-compile: always eager",
    )  # fmt: skip


def add_grammar_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument(
        "--json-schema", metavar="FILE",
        help="answer with one JSON value valid against the JSON schema in FILE, every time: each token is "
        "chosen among those that keep the output inside the schema (constrained decoding, attnkit[grammar]); an "
        "answer cut by --max-new-tokens before it is complete is reported on stderr",
    )  # fmt: skip


def grammar_option(args: argparse.Namespace, model: Model) -> dict:
    """``generate``'s ``grammar`` from ``--json-schema FILE`` (none: no option), compiled for
    ``model``'s tokenizer now, so that a schema the engine refuses is an error naming the file
    before any decoding."""
    if args.json_schema is None:
        return {}
    from attnkit.generation.grammar import Grammar, GrammarError, compile_grammar

    try:
        text = Path(args.json_schema).read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"--json-schema {args.json_schema}: cannot read it ({e.strerror})") from None
    cfg = model.config
    eos = getattr(args, "eos_id", None)  # chat has no --eos-id
    eos = cfg.eos_token_id if eos is None else eos
    try:
        grammar = Grammar.json_schema(text)
        compile_grammar(
            grammar, tokenizer_of(model, args.model, ids_hint=False), cfg.vocab_size, [] if eos is None else [eos]
        )
    except GrammarError as e:
        raise ValueError(f"--json-schema {args.json_schema}: {e}") from None
    return {"grammar": grammar}


def compile_option(args: argparse.Namespace) -> bool | str:
    """``generate``'s ``compile`` from ``--compile`` / ``--no-compile`` (neither: ``"auto"``)."""
    return "auto" if args.compile is None else args.compile


def require(*packages: str) -> None:
    """Import the optional ``packages`` a command needs now, before it does any work: a missing
    one fails at once (and :func:`attnkit.cli.main` names the extra that installs it), not
    after ten minutes of training."""
    for package in packages:
        importlib.import_module(package)


def add_no_repeat_ngram_flag(group: argparse._ActionsContainer) -> None:
    group.add_argument(
        "--no-repeat-ngram-size", metavar="N", type=int, help="never output the same N-gram twice (default: off)"
    )
    group.add_argument(
        "--no-repeat-ngram-unit",
        choices=["token", "word"],
        help="what the N-grams of --no-repeat-ngram-size are made of: token ids (the default, as transformers) "
        "or the text's words (also catches a repeat spelt by other tokens)",
    )


MODEL_DIR = "model directory (attnkit's or Hugging Face's)"


def add_model_flag(parser: argparse.ArgumentParser, what: str = MODEL_DIR) -> None:
    parser.add_argument("--model", required=True, metavar="DIR", help=what)


def input_lines(args: argparse.Namespace, given: list[str] | None) -> Iterator[str]:
    """The inputs, one per line: from the command line, else ``--input FILE``, else standard
    input, read lazily so that a batch is decoded as soon as its lines have arrived."""
    if given:
        yield from given
        return
    if args.input is not None:
        path = Path(args.input)
        if not path.is_file():
            raise FileNotFoundError(f"--input {args.input} is not a file")
        if path.stat().st_size == 0:
            raise ValueError(f"--input {args.input} is empty; put one input per line")
        with open(path, "rb") as stream:
            yield from text_lines(stream, f"--input {args.input}")
        return
    if sys.stdin.isatty():
        print(f"attnkit {args.command}: reading one input per line from standard input (Ctrl-D ends)", file=sys.stderr)
    yield from text_lines(getattr(sys.stdin, "buffer", sys.stdin), "standard input")


def count_input_lines(args: argparse.Namespace) -> int:
    """How many lines ``--input FILE`` holds, every one checked as :func:`input_lines` reads
    them: a bad line is refused before anything is decoded or written."""
    return sum(1 for _ in input_lines(args, None))


def streamed(args: argparse.Namespace, given: list[str] | None) -> bool:
    """Whether the inputs arrive as a stream (standard input from a pipe or a terminal), whose
    next line may wait on the answer to the last; a file, redirected or named, is all there."""
    if given or args.input is not None:
        return False
    try:
        return not stat.S_ISREG(os.fstat(sys.stdin.fileno()).st_mode)
    except (OSError, ValueError):  # no real descriptor (a test's replaced stdin): treat as a stream
        return True


def text_lines(stream: Iterable[bytes | str], source: str) -> Iterator[str]:
    """The lines of ``stream`` without their line endings, refused with the line number when
    they are not UTF-8 text (a leading byte-order mark is dropped)."""
    for lineno, line in enumerate(stream, start=1):
        if (b"\0" if isinstance(line, bytes) else "\0") in line:
            raise ValueError(f"{source} looks binary (a NUL byte on line {lineno}); pass UTF-8 text, an input per line")
        try:
            text = line.decode("utf-8") if isinstance(line, bytes) else line
        except UnicodeDecodeError as err:
            raise ValueError(
                f"{source}: line {lineno} is not valid UTF-8 (byte 0x{line[err.start]:02x}); re-encode it as UTF-8, "
                "e.g. with iconv -f latin1 -t utf-8"
            ) from None
        yield (text.removeprefix("\ufeff") if lineno == 1 else text).rstrip("\r\n")


def in_batches(items: Iterable[_T], size: int) -> Iterator[list[_T]]:
    batch: list[_T] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def one_line(text: str) -> str:
    """One output line per input: newlines inside a text are written as a literal ``\\n``."""
    return text.replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\n")


def emit(lines: list[str]) -> None:
    print("\n".join(lines), flush=True)  # each batch as soon as it is decoded


def parse_ids(text: str) -> list[int]:
    try:
        ids = [int(token) for token in text.split()]
    except ValueError:
        raise ValueError(f"--ids takes space-separated integer token ids, got {text!r}") from None
    if not ids:
        raise ValueError("--ids needs at least one token id")
    return ids


def held_out(run: RunConfig, split: str) -> list:
    from attnkit.data.prepare import held_out as read_held_out

    if split == "test" and run.data.corpus == "files":  # user files have no test split: their held-out part is valid
        split = "valid"
    return read_held_out(run, split)
