"""The ``attnkit`` command line. The only module that prints."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import math
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

from attnkit import __version__
from attnkit.config import RunConfig
from attnkit.data.specials import BOS

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from attnkit.chapter.report import Section
    from attnkit.models.core import Model

_T = TypeVar("_T")


def _smoke(args: argparse.Namespace) -> int:
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


def _load_for(directory: str, command: str) -> Model:
    """The model of ``directory``, refused with a pointer to the right command when its family
    does not fit ``command``."""
    import attnkit

    model = attnkit.from_pretrained(directory)
    cfg = model.config
    if cfg.family == "bert":
        raise ValueError(
            f"{directory} holds a BERT encoder, which does not {command}; use attnkit fill-mask for [MASK] predictions"
        )
    if command == "generate" and cfg.is_encoder_decoder:
        raise ValueError(
            f"{directory} holds an encoder-decoder ({cfg.family}) model; generate continues decoder-only models, "
            f"use: attnkit translate --model {directory}"
        )
    if command == "translate" and not cfg.is_encoder_decoder:
        raise ValueError(
            f"{directory} holds a decoder-only ({cfg.family}) model; translate needs an encoder-decoder, "
            f"use: attnkit generate --model {directory}"
        )
    return model


def _tokenizer(model: Model, directory: str, ids_hint: bool) -> Tokenizer:
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        hint = ', or pass token ids with --ids "1 2 3"' if ids_hint else ""
        raise ValueError(
            f"{directory} has no tokenizer.json, so text cannot be encoded; put the model's tokenizer.json there "
            f"(save_pretrained writes model.tokenizer){hint}"
        )
    return tokenizer


def _decoding_options(args: argparse.Namespace, vocab_size: int) -> dict:
    """``generate`` keyword arguments from the decoding flags, each checked with the flag's name."""
    for flag, value in [("--max-new-tokens", args.max_new_tokens), ("--num-beams", args.num_beams)]:
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    for flag, value in [("--temperature", args.temperature), ("--length-penalty", args.length_penalty)]:
        if value is not None and not math.isfinite(value):
            raise ValueError(f"{flag} must be a finite number, got {value}")
    if args.temperature is not None and not args.temperature > 0:
        raise ValueError(f"--temperature must be > 0, got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1], got {args.top_p}")
    flags = {"--temperature": args.temperature, "--top-k": args.top_k, "--top-p": args.top_p}
    set_without_sampling = [flag for flag, value in flags.items() if value is not None]
    if set_without_sampling and not args.do_sample:
        verb = "applies" if len(set_without_sampling) == 1 else "apply"
        raise ValueError(f"{', '.join(set_without_sampling)} {verb} only when sampling; add --do-sample")
    if args.do_sample and args.num_beams > 1:
        raise ValueError(f"--do-sample samples one path per input; use --num-beams 1 (got {args.num_beams})")
    if args.no_repeat_ngram_size is not None and args.no_repeat_ngram_size < 1:
        raise ValueError(f"--no-repeat-ngram-size must be >= 1, got {args.no_repeat_ngram_size} (3 is usual)")
    for flag, value in [("--eos-id", args.eos_id), ("--pad-id", args.pad_id)]:
        if value is not None and not 0 <= value < vocab_size:
            raise ValueError(f"{flag} must be a token id in [0, {vocab_size}), got {value}")
    return dict(
        max_new_tokens=args.max_new_tokens,
        num_beams=args.num_beams,
        length_penalty=args.length_penalty,
        length_penalty_style=args.length_penalty_style,
        do_sample=args.do_sample,
        temperature=1.0 if args.temperature is None else args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        eos_token_id=args.eos_id,
        pad_token_id=args.pad_id,
        no_repeat_ngram_size=args.no_repeat_ngram_size,
    )


def _input_lines(args: argparse.Namespace, given: list[str] | None) -> Iterator[str]:
    """The inputs, one per line: from the command line, else ``--input FILE``, else standard
    input, read lazily so that a batch is decoded as soon as its lines have arrived."""
    if given:
        yield from given
        return
    if args.input is not None:
        from pathlib import Path

        path = Path(args.input)
        if not path.is_file():
            raise FileNotFoundError(f"--input {args.input} is not a file")
        if path.stat().st_size == 0:
            raise ValueError(f"--input {args.input} is empty; put one input per line")
        with open(path, "rb") as stream:
            yield from _text_lines(stream, f"--input {args.input}")
        return
    if sys.stdin.isatty():
        print(f"attnkit {args.command}: reading one input per line from standard input (Ctrl-D ends)", file=sys.stderr)
    yield from _text_lines(getattr(sys.stdin, "buffer", sys.stdin), "standard input")


def _text_lines(stream: Iterable[bytes | str], source: str) -> Iterator[str]:
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


def _batches(items: Iterable[_T], size: int) -> Iterator[list[_T]]:
    batch: list[_T] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _encode(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, special tokens included, without any padding the tokenizer adds."""
    return [[i for i, m in zip(e.ids, e.attention_mask, strict=True) if m] for e in tokenizer.encode_batch(texts)]


def _until_eos(tokens: list[int], eos: int | None) -> list[int]:
    """The generated tokens before the first end token (the rest is padding)."""
    return tokens[: tokens.index(eos)] if eos is not None and eos in tokens else tokens


def _one_line(text: str) -> str:
    """One output line per input: newlines inside a text are written as a literal ``\\n``."""
    return text.replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\n")


def _emit(lines: list[str]) -> None:
    print("\n".join(lines), flush=True)  # each batch as soon as it is decoded


def _generate(args: argparse.Namespace) -> int:
    import torch

    model = _load_for(args.model, "generate")
    cfg = model.config
    options = _decoding_options(args, cfg.vocab_size)
    eos = cfg.eos_token_id if args.eos_id is None else args.eos_id
    pad = cfg.pad_token_id if args.pad_id is None else args.pad_id
    tokenizer = None
    if args.ids is not None:
        inputs: Iterable = [_parse_ids(text) for text in args.ids]
    else:
        tokenizer = _tokenizer(model, args.model, ids_hint=True)
        inputs = _input_lines(args, args.prompt)
    # attnkit's causal-LM objective trains on <s> + text: give its models the same start.
    starts_with_bos = (
        tokenizer is not None and cfg.bos_token_id is not None and tokenizer.token_to_id(BOS) == cfg.bos_token_id
    )
    for index, batch in enumerate(_batches(inputs, args.batch_size)):
        prompts = batch if tokenizer is None else _encode(tokenizer, batch)
        if starts_with_bos:
            prompts = [p if p[:1] == [cfg.bos_token_id] else [cfg.bos_token_id, *p] for p in prompts]
        for n, prompt in enumerate(prompts):
            if not prompt:
                if cfg.bos_token_id is None:
                    raise ValueError(
                        f"prompt {index * args.batch_size + n + 1} is empty and the model has no bos_token_id "
                        "to start from; give it some text"
                    )
                prompt.append(cfg.bos_token_id)
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(prompts):  # left padding: every prompt ends at column width - 1
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        seed = None if args.seed is None else args.seed + index
        out = model.generate(ids, mask, seed=seed, **options)
        lines = []
        for row, prompt in enumerate(prompts):
            new = _until_eos(out[row, width:].tolist(), eos)
            tokens = new if args.only_new else prompt + new
            if tokenizer is None:
                lines.append(" ".join(map(str, tokens)))
            else:
                lines.append(_one_line(tokenizer.decode(tokens, skip_special_tokens=True)))
        _emit(lines)
    return 0


def _fill_mask(args: argparse.Namespace) -> int:
    import attnkit

    model = attnkit.from_pretrained(args.model)
    if model.config.family != "bert":
        raise ValueError(f"{args.model} holds a {model.config.family} model; fill-mask needs a BERT (masked LM)")
    if model.head is None:
        raise ValueError(f"{args.model} is a BERT without its MLM head (e.g. a sentence encoder); it cannot fill masks")
    if args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {args.top_k}")
    tokenizer = _tokenizer(model, args.model, ids_hint=False)
    from attnkit.generation.fill_mask import fill_mask

    for text in args.text:
        print(text)
        for position, candidates in fill_mask(model, tokenizer, text, args.top_k):
            shown = ", ".join(f"{token!r} {p:.3f}" for token, p in candidates)
            print(f"  [MASK] #{position + 1}: {shown}")
    return 0


def _info(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    import attnkit
    from attnkit.training.checkpoint import complete_checkpoints
    from attnkit.training.run import RUN_CONFIG
    from attnkit.training.trainer import METRICS

    directory = Path(args.directory)
    model = attnkit.from_pretrained(directory)
    cfg = model.config
    print(f"{directory}: {cfg.family}, {model.num_parameters():,} parameters")
    layers = f"{cfg.n_layers}+{cfg.decoder_layers}" if cfg.is_encoder_decoder else f"{cfg.n_layers}"
    norm = "pre" if cfg.norm_first else "post"
    print(f"  d_model {cfg.d_model}, d_ff {cfg.d_ff}, heads {cfg.n_heads}, layers {layers},")
    print(f"  vocabulary {cfg.vocab_size}, positions {cfg.positional}, {norm}-LN")
    if (directory / RUN_CONFIG).exists():
        run = json.loads((directory / RUN_CONFIG).read_text(encoding="utf-8"))
        train, data = run["train"], run["data"]
        print(
            f"  objective {train['objective'] or 'the family default'}, data {data['corpus']} {' '.join(data['path'])}"
        )
        optimiser = f"{train['optimizer']} lr {train['lr']} schedule {train['schedule']} warmup {train['warmup']}"
        print(f"  optimiser {optimiser}, batch {train['batch_tokens']} tokens, precision {train['precision']}")
        checkpoints = complete_checkpoints(directory)
        print(f"  checkpoints: {', '.join(p.name for p in checkpoints) or 'none'}")
    if (directory / METRICS).exists():
        records = [json.loads(line) for line in (directory / METRICS).read_text(encoding="utf-8").splitlines()]
        trained = [r for r in records if r["split"] == "train"]
        if trained:
            first, last = trained[0], trained[-1]
            print(f"  training: step {first['step']} loss {first['loss']:.3f} -> step {last['step']} loss "
                  f"{last['loss']:.3f}, {last.get('seconds', 0):.0f} s")  # fmt: skip
        valid = [r for r in records if r["split"] == "valid"]
        if valid:
            shown = {k: v for k, v in valid[-1].items() if k not in ("split", "final") and isinstance(v, float | int)}
            print("  last evaluation: " + ", ".join(f"{k} {v:.4g}" for k, v in shown.items()))
    return 0


def _parse_ids(text: str) -> list[int]:
    try:
        ids = [int(token) for token in text.split()]
    except ValueError:
        raise ValueError(f"--ids takes space-separated integer token ids, got {text!r}") from None
    if not ids:
        raise ValueError("--ids needs at least one token id")
    return ids


def _translate(args: argparse.Namespace) -> int:
    import torch

    model = _load_for(args.model, "translate")
    cfg = model.config
    if args.num_beams is None:
        args.num_beams = 1 if args.do_sample else 4
    if args.length_penalty is None:
        args.length_penalty = 0.6
    if args.source_length_offset < 0:
        raise ValueError(f"--source-length-offset must be >= 0, got {args.source_length_offset}")
    options = _decoding_options(args, cfg.vocab_size)
    eos = cfg.eos_token_id if args.eos_id is None else args.eos_id
    pad = cfg.pad_token_id if args.pad_id is None else args.pad_id
    tokenizer = _tokenizer(model, args.model, ids_hint=False)
    for index, batch in enumerate(_batches(_input_lines(args, args.text), args.batch_size)):
        lines = [""] * len(batch)  # empty sources give empty lines
        rows = [n for n, text in enumerate(batch) if text.strip()]
        sources = _encode(tokenizer, [batch[n] for n in rows])
        rows, sources = [n for n, s in zip(rows, sources, strict=True) if s], [s for s in sources if s]
        for source in sources:  # a source ends with the end token, as in training (Marian's, T5's, attnkit's)
            if eos is not None and source[-1] != eos:
                source.append(eos)
        if sources:
            width = max(len(s) for s in sources)
            ids = torch.full((len(sources), width), pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for row, source in enumerate(sources):
                ids[row, : len(source)] = torch.tensor(source)
                mask[row, : len(source)] = 1
            seed = None if args.seed is None else args.seed + index
            out = model.generate(ids, mask, seed=seed, source_length_offset=args.source_length_offset, **options)
            for row, (n, source) in enumerate(zip(rows, sources, strict=True)):
                # Drop the start token; keep at most source length + offset tokens, up to the end token.
                new = _until_eos(out[row, 1 : 1 + len(source) + args.source_length_offset].tolist(), eos)
                lines[n] = _one_line(tokenizer.decode(new, skip_special_tokens=True))
        _emit(lines)
    return 0


def _add_decoding_flags(
    parser: argparse.ArgumentParser, max_new_tokens: int, num_beams: int | None, length_penalty: float | None
) -> None:
    group = parser.add_argument_group("decoding")
    group.add_argument(
        "--max-new-tokens",
        metavar="N",
        type=int,
        default=max_new_tokens,
        help=f"most tokens generated (default {max_new_tokens})",
    )
    group.add_argument(
        "--num-beams",
        metavar="K",
        type=int,
        default=num_beams,
        help="beams; 1 = greedy (default "
        + ("4, or 1 with --do-sample" if num_beams is None else str(num_beams))
        + ")",
    )
    group.add_argument(
        "--length-penalty",
        metavar="ALPHA",
        type=float,
        default=length_penalty,
        help="length penalty alpha for beam search; 0 = none (default "
        + ("0.6" if length_penalty is None else str(length_penalty))
        + ")",
    )
    group.add_argument(
        "--length-penalty-style",
        choices=["gnmt", "power"],
        default="gnmt",
        help="gnmt: ((5+|Y|)/6)^alpha, the paper's; power: |Y|^alpha, Hugging Face's (default gnmt)",
    )
    group.add_argument(
        "--no-repeat-ngram-size", metavar="N", type=int, help="never output the same N-gram twice (default: off)"
    )
    group.add_argument("--do-sample", action="store_true", help="sample instead of taking the most likely token")
    group.add_argument("--temperature", metavar="T", type=float, help="sampling temperature > 0 (default 1.0)")
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
    parser.add_argument("--batch-size", metavar="N", type=int, default=16, help="inputs decoded together (default 16)")


def _overrides(extra: Sequence[str]) -> dict[str, str]:
    """``--section.key=value`` or ``--section.key value`` pairs from the command line."""
    overrides: dict[str, str] = {}
    items = list(extra)
    while items:
        item = items.pop(0)
        if not item.startswith("--") or "." not in item.split("=", 1)[0]:
            raise ValueError(f"unrecognised argument {item!r}; config options look like --train.max_steps=100")
        key, sep, value = item[2:].partition("=")
        if not sep:
            if not items or items[0].startswith("--"):
                raise ValueError(f"--{key} needs a value, e.g. --{key}=VALUE")
            value = items.pop(0)
        overrides[key] = value
    return overrides


def _run_config(args: argparse.Namespace) -> RunConfig:
    from attnkit.config import apply_overrides, load_run_config, run_preset

    if args.config and args.preset:
        raise ValueError("pass --preset or --config, not both")
    if not (args.config or args.preset):
        raise ValueError("pass --preset NAME (see --help for the list) or --config FILE")
    run = load_run_config(args.config) if args.config else run_preset(args.preset)
    return apply_overrides(run, _overrides(args.overrides))


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event, received: list[int]) -> Iterator[None]:
    """While training: the first SIGINT or SIGTERM sets ``stop``, and the trainer finishes its
    step and writes a checkpoint; a second one raises KeyboardInterrupt, which abandons the step
    or the save under way (a save interrupted so leaves the checkpoints before it intact)."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread receives signals
        yield
        return

    def handle(signum: int, frame: object) -> None:
        received.append(signum)
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        name = signal.Signals(signum).name
        notice = f"\nattnkit: {name}: finishing the step and saving a checkpoint ({name} again abandons it)\n"
        os.write(2, notice.encode())  # not print: the handler may run in the middle of another print

    previous = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _train(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from attnkit.training.checkpoint import CheckpointSaveError, latest_checkpoint
    from attnkit.training.run import RUN_CONFIG, train
    from attnkit.training.trainer import TrainingStoppedError

    if args.resume and not (args.config or args.preset) and args.out and (Path(args.out) / RUN_CONFIG).is_file():
        args.config = str(Path(args.out) / RUN_CONFIG)  # `attnkit train --out DIR --resume`: the run's own config
    run = _run_config(args)
    if args.print_config:
        print(json.dumps(run.to_dict(), indent=2))
        return 0
    if args.out is None:
        raise ValueError("pass --out DIR: the run directory to write")
    if args.session_steps is not None and args.session_steps < 1:
        raise ValueError(f"--session-steps must be >= 1, got {args.session_steps}")
    reporter = os.environ.get("RANK", "0") == "0"  # under torchrun, rank 0 reports
    resume = f"attnkit train --out {shlex.quote(args.out)} --resume"
    start = time.perf_counter()
    stop, received = threading.Event(), []
    try:
        with _stop_on_signals(stop, received):
            progress, final = train(run, args.out, resume=args.resume, force=args.force, progress_bar=not args.quiet,
                                    session_steps=args.session_steps, stop=stop)  # fmt: skip
    except TrainingStoppedError as stopped:
        name = signal.Signals(received[0]).name
        if reporter and stopped.checkpoint is None:
            print(f"attnkit: stopped by {name} before the first step; nothing to save; start again with: {resume}",
                  file=sys.stderr)  # fmt: skip
        elif reporter:
            print(f"attnkit: stopped at step {stopped.step} by {name}; checkpoint {stopped.checkpoint}; "
                  f"resume with: {resume}", file=sys.stderr)  # fmt: skip
        return 128 + received[0]
    except KeyboardInterrupt:
        if len(received) < 2:  # no handler of ours ran: an interrupt outside the main thread's training
            raise
        latest = latest_checkpoint(Path(args.out))
        kept = f"its last complete checkpoint is {latest}" if latest else "it has no checkpoint yet"
        if reporter:
            print(f"attnkit: abandoned by a second {signal.Signals(received[-1]).name}; {kept}; resume with: {resume}",
                  file=sys.stderr)  # fmt: skip
        return 128 + received[-1]
    except CheckpointSaveError as err:
        if args.debug:
            raise
        print(f"attnkit: error: {err}, then resume with: {resume}", file=sys.stderr)
        return 1
    if not reporter:
        return 0
    metrics = ", ".join(f"{k} {v:.4g}" for k, v in final.items() if k != "tokens")
    saved = _saved_run(args.out)
    print(
        f"step {progress.step}: {progress.tokens:,} target tokens in {progress.seconds:.0f} s of training "
        f"(seed {saved.train.seed}, {progress.tokens / max(progress.seconds, 1e-9):,.0f} target tokens/s)"
    )
    print(f"validation: {metrics}")
    if saved.objective == "translation":
        _print_translation_report(args.out, saved)
    print(f"run directory: {args.out}  (total time {time.perf_counter() - start:.0f} s)")
    if saved.objective == "translation":
        decoding = "--length-penalty 1 --no-repeat-ngram-size 3"  # the report's tuned beam
        print(f'use it: attnkit translate --model {args.out} {decoding} "Blessed are the meek"')
    else:
        print(f"use it: attnkit.from_pretrained({str(args.out)!r}); continue training with --resume")
    return 0


def _saved_run(run_dir: str) -> RunConfig:
    import json
    from pathlib import Path

    from attnkit.config import run_from_dict
    from attnkit.training.run import RUN_CONFIG

    path = Path(run_dir) / RUN_CONFIG
    if not path.exists():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no {RUN_CONFIG}); pass the --out of attnkit train")
    return run_from_dict(json.loads(path.read_text(encoding="utf-8")))


def _held_out(run: RunConfig, split: str) -> list:
    from attnkit.training.run import read_texts

    texts = read_texts(run)
    part = texts.get(split)
    if not part and split == "test":  # user files have no test split: their held-out part is valid
        part = texts.valid
    return part


def _print_translation_report(run_dir: str, run: RunConfig, split: str = "test") -> None:
    from pathlib import Path

    import attnkit
    from attnkit.training.report import plot_training_curve, translation_report

    model = attnkit.from_pretrained(run_dir)
    pairs = _held_out(run, split)
    report = translation_report(model, model.tokenizer, pairs, run.data.max_tokens, Path(run_dir) / "alignment.png")
    print(f"held-out {split} ({report.sentences} sentences), sacreBLEU {report.greedy.signature}:")
    print(f"  greedy                           BLEU {report.greedy.bleu:5.2f}  chrF {report.greedy.chrf:5.2f}")
    print(f"  beam 4, α=0.6                    BLEU {report.beam.bleu:5.2f}  chrF {report.beam.chrf:5.2f}")
    print(f"  beam 4, α=1.0, no 3-gram twice   BLEU {report.tuned.bleu:5.2f}  chrF {report.tuned.chrf:5.2f}")
    for source, reference, hypothesis in report.samples:
        print(f"  source:    {source}\n  reference: {reference}\n  attnkit:   {hypothesis}")
    if report.figure is not None:
        print(f"cross-attention alignment of the first sample: {report.figure}")
    curve = plot_training_curve(Path(run_dir), Path(run_dir) / "curve.png")
    print(f"training curve (loss and learning rate against seconds): {curve}")


def _evaluate(args: argparse.Namespace) -> int:
    import math

    import attnkit
    from attnkit.data.tokenizer import specials_of
    from attnkit.training.evaluate import evaluate
    from attnkit.training.report import score_translations
    from attnkit.training.run import encode, make_objective

    run = _saved_run(args.model)
    pairs = _held_out(run, args.split)
    model = attnkit.from_pretrained(args.model)
    if run.objective == "translation":
        if args.no_repeat_ngram_size is not None and args.no_repeat_ngram_size < 1:
            raise ValueError(f"--no-repeat-ngram-size must be >= 1, got {args.no_repeat_ngram_size} (3 is usual)")
        options = {"num_beams": args.num_beams, "no_repeat_ngram_size": args.no_repeat_ngram_size}
        if args.num_beams > 1:
            options.update(length_penalty=args.length_penalty, length_penalty_style="gnmt")
        scores = score_translations(model, model.tokenizer, pairs, run.data.max_tokens, **options)
        result = f"BLEU {scores.bleu:.2f}, chrF {scores.chrf:.2f}"
        print(f"{args.split}: {len(pairs)} sentences, beam {args.num_beams}: {result}")
        print(f"  {scores.signature}")
        return 0
    examples = encode(model.tokenizer, pairs, run.data.max_tokens)
    objective = make_objective(run, specials_of(model.tokenizer))
    everything = RunConfig(run.model, dataclasses.replace(run.train, eval_batches=len(examples)), run.data)
    result = evaluate(model, objective, examples, everything)
    shown = ", ".join(f"{k} {v:.4g}" for k, v in result.items() if isinstance(v, float) and math.isfinite(v))
    print(f"{args.split}: {len(examples)} examples, {result['tokens']} target tokens: {shown}")
    return 0


def _average(args: argparse.Namespace) -> int:
    from attnkit.training.average import average_checkpoints

    model, used = average_checkpoints(args.run_dir, args.last)
    model.save_pretrained(args.out, overwrite=args.force)
    print(f"averaged {len(used)} checkpoints ({', '.join(p.name for p in used)}) into {args.out}")
    return 0


def _figures(args: argparse.Namespace) -> int:
    from pathlib import Path

    from attnkit.chapter.figures import EXPERIMENTS, check_output_dir, write_report
    from attnkit.chapter.report import Context

    out = Path(args.out)
    check_output_dir(out, args.force)
    names = args.only or EXPERIMENTS
    start = time.perf_counter()

    def done(name: str, section: Section, seconds: float) -> None:
        print(f"[{names.index(name) + 1}/{len(names)}] {section.title}: {seconds:.1f} s", flush=True)

    ctx = Context(out=out, quick=args.quick, seed=args.seed, model=args.model)
    report = write_report(ctx, names, on_section=done)
    print(f"wrote {report} and its figures in {time.perf_counter() - start:.0f} s")
    return 0


def _bench(args: argparse.Namespace) -> int:
    if not os.path.isfile(os.path.join("benchmarks", "__main__.py")):
        raise ValueError(
            "attnkit bench runs the benchmarks/ folder of a source checkout: run it from the repository root"
        )
    sys.path.insert(0, os.getcwd())
    from benchmarks.__main__ import main as benchmarks_main

    sys.argv = ["attnkit bench", *args.suite_args, *args.overrides]
    benchmarks_main()
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

    from attnkit.config import PRESETS

    train = sub.add_parser(
        "train",
        help="train a model with its family's objective on your data",
        description="Train a preset (or a config file) on plain-text files (language models) or "
        "tab-separated source/target files (translation). Any config value can be overridden "
        f"as --section.key=value (sections: model, train, data). Presets: {', '.join(sorted(PRESETS))}.",
        epilog="examples:\n"
        "  attnkit train --preset gpt-tiny --data.path notes.txt --train.max_steps=500 --out runs/gpt\n"
        "  attnkit train --preset transformer-tiny --data.path pairs.tsv --train.time_budget=600 --out runs/mt\n"
        "  attnkit train --out runs/gpt --resume\n"
        "  torchrun --nproc-per-node 2 -m attnkit train --preset gpt-tiny --data.path notes.txt --out runs/ddp",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("--preset", help="a model preset (the family's objective and usual optimiser come with it)")
    train.add_argument("--config", help="a run config file (JSON or YAML, sections model/train/data)")
    train.add_argument("--out", help="run directory (refused if it holds a run, unless --resume or --force)")
    train.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its last checkpoint (with its own config when no --preset or --config)",
    )
    train.add_argument("--force", action="store_true", help="start the run in --out over, deleting its checkpoints")
    train.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    train.add_argument("--session-steps", type=int, help="stop after this many steps (with a checkpoint)")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(run=_train, accepts_overrides=True)

    evaluate = sub.add_parser(
        "evaluate",
        help="score a trained run on its held-out split (BLEU/chrF, or loss and perplexity)",
        description="Evaluate a run directory's model on its corpus's held-out split: sacreBLEU BLEU and chrF "
        "for translation, loss, perplexity and accuracy for the language models.",
        epilog="example: attnkit evaluate --model runs/translate-en-fr --split test --num-beams 4",
    )
    evaluate.add_argument("--model", required=True, help="a run directory (written by attnkit train)")
    evaluate.add_argument("--split", choices=["valid", "test"], default="test", help="held-out split (default test)")
    evaluate.add_argument("--num-beams", type=int, default=4, help="beam size for translation (default 4; 1 = greedy)")
    evaluate.add_argument("--length-penalty", type=float, default=0.6, help="GNMT α for beam search (default 0.6)")
    evaluate.add_argument(
        "--no-repeat-ngram-size", metavar="N", type=int, help="never output the same N-gram twice (default: off)"
    )
    evaluate.set_defaults(run=_evaluate)

    fill = sub.add_parser(
        "fill-mask",
        help="BERT: the top-k predictions for each [MASK] in a text",
        description="Predict the tokens hidden behind [MASK] (or the tokenizer's own mask token) with a BERT "
        "model's masked-LM head.",
        epilog='example: attnkit fill-mask --model runs/bert "In the beginning God created the [MASK]."',
    )
    fill.add_argument("--model", required=True, help="a BERT model directory with its MLM head and tokenizer.json")
    fill.add_argument("text", nargs="+", help="texts holding one or more [MASK]")
    fill.add_argument("--top-k", type=int, default=5, help="predictions per mask (default 5)")
    fill.set_defaults(run=_fill_mask)

    info = sub.add_parser(
        "info",
        help="a run's or model's config, size and training summary",
        description="Print a model's shape and parameter count and, for a run directory, its objective, "
        "optimiser, checkpoints, training curve and last evaluation.",
        epilog="example: attnkit info runs/mt",
    )
    info.add_argument("directory", metavar="DIR", help="a run directory or a model directory")
    info.set_defaults(run=_info)

    average = sub.add_parser(
        "average",
        help="average the weights of a run's last k checkpoints",
        description="Average the parameters of the last --last complete checkpoints of a run (the "
        "Transformer paper averages the last 5) and write an attnkit model directory.",
        epilog="example: attnkit average runs/mt --last 5 --out runs/mt-avg5",
    )
    average.add_argument("run_dir", metavar="RUN", help="the run directory")
    average.add_argument("--last", type=int, default=5, help="how many checkpoints (default 5)")
    average.add_argument("--out", required=True, help="the model directory to write")
    average.add_argument("--force", action="store_true", help="replace a non-empty --out")
    average.set_defaults(run=_average)

    from attnkit.chapter.figures import EXPERIMENTS

    figures = sub.add_parser(
        "figures",
        help="run the chapter's experiments: figures and a measured REPORT.md",
        description="Regenerate every figure, property and table of the chapter from live code: the flow of "
        "attention, the 1/sqrt(d_k) variance argument, positional encodings and their rotation, the causal "
        "mask, attention heads of a trained translator, the complexity table measured, pre-LN vs post-LN, "
        "and the three families trained side by side. Writes PNGs, REPORT.md and report.json to --out.",
        epilog="examples:\n"
        "  attnkit figures --quick --out /tmp/chapter\n"
        "  attnkit figures --out chapter-report --model runs/translate-en-fr-20261130-0510\n"
        "  attnkit figures --only heads --model runs/translate-en-fr-20261130-0510 --out chapter-report",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    figures.add_argument("--out", default="chapter-report", help="output directory (default chapter-report)")
    figures.add_argument("--quick", action="store_true", help="CI-sized shapes and budgets (about 2 minutes)")
    figures.add_argument("--seed", type=int, default=0, help="seed of every random draw (default 0)")
    figures.add_argument("--model", metavar="RUN", help="a trained translator for the attention-heads section")
    figures.add_argument(
        "--only", nargs="+", choices=EXPERIMENTS, metavar="NAME",
        help=f"run only these ({', '.join(EXPERIMENTS)}); an earlier report in --out keeps the others",
    )  # fmt: skip
    figures.add_argument("--force", action="store_true", help="write into a non-empty --out")
    figures.set_defaults(run=_figures)

    bench = sub.add_parser(
        "bench",
        help="the benchmark suite (from a source checkout): attnkit against transformers and torch.nn",
        description="Run one suite of benchmarks/ (python -m benchmarks): peak, forward, training, generation, "
        "latency, attention or translation; each case runs attnkit and its peer alternately in one process and "
        "prints the median and min-max of each, and their ratio.",
        epilog="examples:\n"
        "  attnkit bench peak\n"
        "  attnkit bench training --compile --out benchmarks/results/training-compiled.json\n"
        "  attnkit bench attention --small",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    bench.add_argument("suite_args", nargs=argparse.REMAINDER, help="the suite and its options (see --help)")
    bench.set_defaults(run=_bench, accepts_overrides=True)

    generate = sub.add_parser(
        "generate",
        help="continue prompts with a decoder-only model (GPT)",
        description="Continue each prompt with a decoder-only model; print one line per prompt, in input order:\n"
        "the prompt and its continuation (only the continuation with --only-new), decoded with the\n"
        "directory's tokenizer.json, special tokens skipped, newlines inside a text written as \\n.\n"
        "Prompts come from --prompt, else --input FILE, else standard input, one per line; each batch\n"
        "is printed as soon as it is decoded (--batch-size 1 answers line by line). With --ids the\n"
        "prompts and the output are token ids. An empty prompt starts from the model's bos_token_id.\n"
        "Greedy by default; --num-beams N for beam search, --do-sample to sample.",
        epilog="examples:\n"
        '  attnkit generate --model ./gpt2 --prompt "Attention is" --max-new-tokens 20\n'
        "  attnkit generate --model ./gpt2 --do-sample --top-p 0.9 --seed 0 < prompts.txt\n"
        '  attnkit generate --model ./gpt2 --ids "464 3241 318" --only-new',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    generate.add_argument("--model", required=True, metavar="DIR", help="model directory (attnkit's or Hugging Face's)")
    source = generate.add_mutually_exclusive_group()
    source.add_argument("--prompt", action="append", metavar="TEXT", help="a prompt (repeat for several)")
    source.add_argument("--ids", action="append", metavar='"ID ID ..."', help="a prompt as token ids (repeatable)")
    source.add_argument("--input", metavar="FILE", help="prompts, one per line (default: standard input)")
    generate.add_argument("--only-new", action="store_true", help="print only the continuation, not the prompt")
    _add_decoding_flags(generate, max_new_tokens=50, num_beams=1, length_penalty=0.0)
    generate.set_defaults(run=_generate)

    translate = sub.add_parser(
        "translate",
        help="translate lines with an encoder-decoder model (Transformer, Marian, T5)",
        description="Translate each source with an encoder-decoder model; print one line per source, in input\n"
        "order (an empty source gives an empty line), decoded with the directory's tokenizer.json, the\n"
        "start and special tokens skipped, newlines inside a text written as \\n. Sources are the TEXT\n"
        "arguments, else --input FILE, else standard input, one per line; each batch of --batch-size\n"
        "is printed as soon as it is decoded. Each source ends with the end token, appended where the\n"
        "tokenizer does not add it (attnkit's translation objective trains on source + eos).\n"
        "The defaults are the paper's (Vaswani et al. 2017, section 6.1): beam search with 4 beams,\n"
        "length penalty alpha = 0.6 in the gnmt form ((5+|Y|)/6)^alpha, and at most source length + 50\n"
        "tokens (--source-length-offset).",
        epilog="examples:\n"
        '  attnkit translate --model ./opus-mt-en-de "Attention is all you need."\n'
        "  attnkit translate --model ./opus-mt-en-de --batch-size 32 < news.en > news.de\n"
        "  attnkit translate --model ./my-run-model --num-beams 1 --input test.src",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    translate.add_argument(
        "--model", required=True, metavar="DIR", help="model directory (attnkit's or Hugging Face's)"
    )
    translate.add_argument(
        "text", nargs="*", metavar="TEXT", help="sources to translate (default: --input FILE or standard input)"
    )
    translate.add_argument("--input", metavar="FILE", help="sources, one per line, when no TEXT is given")
    _add_decoding_flags(translate, max_new_tokens=256, num_beams=None, length_penalty=None)
    translate.add_argument(
        "--source-length-offset",
        type=int,
        default=50,
        metavar="N",
        help="stop each translation at its source length + N tokens (default 50, the paper's)",
    )
    translate.set_defaults(run=_translate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "accepts_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.overrides = extra
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, format="%(message)s")
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError) as err:
        if args.debug:  # exit status 2: a usage error, in the arguments or the files they name
            raise
        print(f"attnkit: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`attnkit translate ... | head`): stop quietly
        if args.debug:
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush cannot fail again
        return 1
    except KeyboardInterrupt:
        if args.debug:
            raise
        return 130
    except Exception as err:  # exit status 1: the command failed (a permission, the disk, a bug)
        if args.debug:
            raise
        message = " ".join(str(err).split()) or "no message"
        print(f"attnkit: error: {type(err).__name__}: {message} (--debug shows the traceback)", file=sys.stderr)
        return 1
