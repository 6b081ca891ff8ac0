"""``attnkit train``: train a run preset or config file into a run directory, with exact resume."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from attnkit.cli.common import held_out, require
from attnkit.config import PRESETS, RunConfig


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
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
    parser.add_argument("--preset", help="a model preset (the family's objective and usual optimiser come with it)")
    parser.add_argument("--config", help="a run config file (JSON or YAML, sections model/train/data)")
    parser.add_argument("--out", help="run directory (refused if it holds a run, unless --resume or --force)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its last checkpoint (with its own config when no --preset or --config)",
    )
    parser.add_argument("--force", action="store_true", help="start the run in --out over, deleting its checkpoints")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("--session-steps", type=int, help="stop after this many steps (with a checkpoint)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or progress lines")
    parser.add_argument(
        "--progress-every", metavar="SECONDS", type=float, default=30.0,
        help="where the output is not a terminal (a pipe, a log): a progress line this often (default 30)",
    )  # fmt: skip
    parser.set_defaults(run=run, accepts_overrides=True)


# The command's steps in the order it prints them (config, machine, fit, train, report, the
# resume line); each step is a call into the library, the length is their sequence.
def run(args: argparse.Namespace) -> int:
    import json

    from attnkit.models.run_dir import RUN_CONFIG, latest_checkpoint, read_run_config
    from attnkit.training.checkpoint import CheckpointSaveError
    from attnkit.training.run import train
    from attnkit.training.trainer import TrainingStoppedError

    if args.resume and not (args.config or args.preset) and args.out and (Path(args.out) / RUN_CONFIG).is_file():
        args.config = str(Path(args.out) / RUN_CONFIG)  # `attnkit train --out DIR --resume`: the run's own config
    config = run_config(args)
    if args.print_config:
        print(json.dumps(config.to_dict(), indent=2))
        return 0
    if args.out is None:
        raise ValueError("pass --out DIR: the run directory to write")
    if config.objective == "translation":
        require("sacrebleu", "matplotlib")  # the report at the end scores and draws
    if not args.progress_every > 0:
        raise ValueError(f"--progress-every must be > 0 seconds, got {args.progress_every}")
    if args.session_steps is not None and args.session_steps < 1:
        raise ValueError(f"--session-steps must be >= 1, got {args.session_steps}")
    reporter = os.environ.get("RANK", "0") == "0"  # under torchrun, rank 0 reports
    from attnkit.machine import keep_freed_memory
    from attnkit.training.fit import fit_for

    # A step allocates the same large tensors again and again (the vocabulary's rows, the FFN's
    # activations): reused, not mapped afresh with a page fault per 4 kB each time (2026-12-02: up
    # to 28,000 faults a step of the demo's fp32 training, about a fifth of its time).
    keep_freed_memory()

    table, no_fit = fit_for(
        None if args.config else args.preset, overrides(args.overrides), config.train.fit, config.train.time_budget
    )
    resume = f"attnkit train --out {shlex.quote(args.out)} --resume"
    start = time.perf_counter()
    stop, received = threading.Event(), []
    try:
        with stop_on_signals(stop, received):
            progress, final = train(
                config, args.out, resume=args.resume, force=args.force, progress_bar=not args.quiet,
                session_steps=args.session_steps, stop=stop, progress_every=args.progress_every,
                fit=table, no_fit=no_fit, announce=print if reporter else None,
            )  # fmt: skip
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
    saved = read_run_config(args.out)[0]
    print(
        f"step {progress.step}: {progress.tokens:,} target tokens in {progress.seconds:.0f} s of training "
        f"(seed {saved.train.seed}, {progress.tokens / max(progress.seconds, 1e-9):,.0f} target tokens/s)"
    )
    print(f"validation: {metrics}")
    before = _before_fine_tuning(Path(args.out))
    if before is not None:
        print(f"before fine-tuning ({saved.train.init}): validation loss {before['loss']:.4g}, "
              f"perplexity {before['perplexity']:.4g}")  # fmt: skip
    if saved.objective == "translation":
        print_translation_report(args.out, saved)
    print(f"run directory: {args.out}  (total time {time.perf_counter() - start:.0f} s)")
    if saved.objective == "translation":
        decoding = "--length-penalty 1 --no-repeat-ngram-size 3 --no-repeat-ngram-unit word"  # the tuned beam
        print(f'use it: attnkit translate --model {args.out} {decoding} "Blessed are the meek"')
    else:
        print(f"use it: attnkit.from_pretrained({str(args.out)!r}); continue training with --resume")
    return 0


def overrides(extra: Sequence[str]) -> dict[str, str]:
    """``--section.key=value`` or ``--section.key value`` pairs from the command line."""
    overrides: dict[str, str] = {}
    items = list(extra)
    while items:
        item = items.pop(0)
        if item.split("=", 1)[0] == "--weights":
            raise ValueError(
                "--weights chooses an inference format (translate, generate, evaluate); training keeps fp32 weights, "
                "with --train.precision=bf16 (or auto) for bf16 autocast"
            )
        if not item.startswith("--") or "." not in item.split("=", 1)[0]:
            raise ValueError(f"unrecognised argument {item!r}; config options look like --train.max_steps=100")
        key, sep, value = item[2:].partition("=")
        if not sep:
            if not items or items[0].startswith("--"):
                raise ValueError(f"--{key} needs a value, e.g. --{key}=VALUE")
            value = items.pop(0)
        overrides[key] = value
    return overrides


def run_config(args: argparse.Namespace) -> RunConfig:
    from attnkit.config import apply_overrides, load_run_config, run_preset

    if args.config and args.preset:
        raise ValueError("pass --preset or --config, not both")
    if not (args.config or args.preset):
        raise ValueError("pass --preset NAME (see --help for the list) or --config FILE")
    from attnkit.training.run import ignored_by_fine_tuning

    config = load_run_config(args.config) if args.config else run_preset(args.preset)
    given = overrides(args.overrides)
    config = apply_overrides(config, given)
    if config.train.init is not None and (ignored := ignored_by_fine_tuning(config, given)):
        raise ValueError(
            f"--{ignored[0]}={given[ignored[0]]} with train.init={config.train.init}: fine-tuning takes the pretrained "
            f"model's {ignored[0].removeprefix('model.')}, not this; drop --{ignored[0]}, or train from scratch "
            "without train.init"
        )
    return config


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event, received: list[int]) -> Iterator[None]:
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


def print_translation_report(run_dir: str, run: RunConfig, split: str = "test") -> None:
    import attnkit
    from attnkit.chapter.alignment import plot_alignment
    from attnkit.training.report import plot_training_curve, translation_report

    model = attnkit.from_pretrained(run_dir)
    pairs = held_out(run, split)
    report = translation_report(model, model.tokenizer, pairs, run.data.max_tokens)
    print(f"held-out {split} ({report.sentences} sentences), sacreBLEU {report.greedy.signature}:")
    for label, scores in [
        ("greedy", report.greedy),
        ("beam 4, α=0.6", report.beam),
        ("beam 4, α=1.0, no word 3-gram twice", report.tuned),
    ]:
        print(f"  {label:<37}BLEU {scores.bleu:5.2f}  chrF {scores.chrf:5.2f}")
    for source, reference, hypothesis in report.samples:
        print(f"  source:    {source}\n  reference: {reference}\n  attnkit:   {hypothesis}")
    if report.samples:
        figure = plot_alignment(model, model.tokenizer, report.samples[0][0], Path(run_dir) / "alignment.png")
        print(f"cross-attention alignment of the first sample: {figure}")
    curve = plot_training_curve(Path(run_dir), Path(run_dir) / "curve.png")
    print(f"training curve (loss and learning rate against seconds): {curve}")


def _before_fine_tuning(run_dir: Path) -> dict | None:
    """The pretrained model's validation record, written before a fine-tuning run's first step."""
    import json

    from attnkit.training.trainer import METRICS

    path = run_dir / METRICS
    if not path.is_file():
        return None
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return next((r for r in records if r.get("before_fine_tuning")), None)
