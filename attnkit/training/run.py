"""A training run from a :class:`~attnkit.config.RunConfig`: the run directory, the data and
tokenizer, the model and objective, resuming, and evaluation.

A run directory holds ``run.json`` (the run config), ``tokenizer.json``, ``metrics.jsonl``
(one JSON object per line) and ``checkpoints/step-*`` (see
:mod:`attnkit.training.checkpoint`); :mod:`attnkit.models.run_dir` reads it.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from attnkit.config import ModelConfig, RunConfig, apply_overrides, objective_mismatch
from attnkit.data.batching import StepBatches
from attnkit.data.prepare import Data, batch_positions, load_data, train_batches
from attnkit.data.specials import ModelSpecials, Specials
from attnkit.data.tokenizer import has_specials, load_tokenizer
from attnkit.loading import PRETRAINED, from_pretrained, is_model, source_path
from attnkit.machine import cpu_class
from attnkit.models import Model, build_model
from attnkit.models.io import CONFIG, TOKENIZER, load_weights
from attnkit.models.run_dir import (
    CHECKPOINTS,
    RUN_CONFIG,
    checkpoint_step,
    latest_checkpoint,
    read_run_config,
    write_run_config,
)
from attnkit.nn import lora
from attnkit.objectives.base import Objective
from attnkit.objectives.causal_lm import CausalLM
from attnkit.objectives.classify import Classify
from attnkit.objectives.masked_lm import MaskedLM
from attnkit.objectives.span_corruption import SpanCorruption
from attnkit.objectives.translation import Translation
from attnkit.training import distributed
from attnkit.training.checkpoint import load_checkpoint, remove_interrupted
from attnkit.training.distributed import World
from attnkit.training.evaluate import evaluate
from attnkit.training.fit import Candidate, FitChoice, FitTable, MachineRecord, choose, measure
from attnkit.training.trainer import METRICS, Progress, Trainer, trim_metrics

log = logging.getLogger(__name__)

# A preset of each family, for the one line that refuses a pretrained model of another family.
FAMILY_PRESETS = {"transformer": "translate-en-fr", "bert": "bert-bible", "gpt": "gpt-bible", "t5": "t5-bible"}


def init_model(run: RunConfig) -> Model | None:
    """The model ``train.init`` names, as :func:`attnkit.loading.from_pretrained` loads it (a
    directory or a name of :data:`~attnkit.loading.PRETRAINED`), checked against the run; None
    without one. Its family must be one that the run's objective trains
    (:func:`~attnkit.config.objective_mismatch`), and its tokenizer the run's."""
    init = run.train.init
    if init is None:
        return None
    source = source_path(init)
    if not is_model(source):
        raise ValueError(
            f"train.init={init!r} is not a model directory (no {CONFIG}) nor a training run's; give one written by "
            f"save_pretrained, a Hugging Face one, a run directory, or a known name ({', '.join(PRETRAINED)})"
        )
    model = from_pretrained(source)
    family = model.config.family
    if why := objective_mismatch(run.objective, family):
        raise ValueError(f"train.init={init!r} is a {family} model: {why}")
    if family != run.model.family:
        raise ValueError(
            f"train.init={init!r} is a {family} model, and this run's model is {run.model.family}; fine-tune it "
            f"with a {family} preset (e.g. --preset {FAMILY_PRESETS[family]} --train.objective={run.objective}"
            f"{' --model.classifier_pooling=last' if family == 'gpt' and run.objective == 'classify' else ''}), or "
            f"pretrain a {run.model.family}"
        )
    if model.tokenizer is None:
        raise ValueError(f"train.init={init!r} has no tokenizer to fine-tune with; use a directory with one")
    if run.data.tokenizer is not None:
        # The init's own tokenizer, not its embedding rows, decides (those may be padded, as t5-small's 32,128
        # rows for 32,100 tokens): another vocabulary, or the same size of other tokens, would give every
        # embedding row another meaning.
        given, own = load_tokenizer(run.data.tokenizer).get_vocab(), model.tokenizer.get_vocab()
        fix = "give the pretraining's own tokenizer, or none (fine-tuning reads it)"
        if len(given) != len(own):
            raise ValueError(
                f"data.tokenizer={run.data.tokenizer} has {len(given):,} tokens and train.init={init!r}'s "
                f"tokenizer {len(own):,}; {fix}"
            )
        moved = sorted(token for token, i in given.items() if own.get(token) != i)
        if moved:
            raise ValueError(
                f"data.tokenizer={run.data.tokenizer} is not train.init={init!r}'s tokenizer: {len(moved):,} of its "
                f"{len(given):,} tokens are at other ids or not there (e.g. {moved[0]!r}); {fix}"
            )
    return model


def _model_specials(run: RunConfig, cfg: ModelConfig | None, tokenizer: Tokenizer | None) -> ModelSpecials | None:
    """A fine-tuned model's own special ids, from its config ``cfg``, where its ``tokenizer`` is
    not attnkit's; None where the run needs none (attnkit's tokenizer names its own)."""
    if cfg is None or run.train.init is None or run.objective == "classify" or has_specials(tokenizer):
        return None
    eos = cfg.eos_token_id
    if eos is None:
        raise ValueError(
            f"train.init={run.train.init!r} names no eos_token_id; a language model ends its texts with it"
        )
    bos = eos if cfg.bos_token_id is None else cfg.bos_token_id
    return ModelSpecials(cfg.vocab_size, cfg.pad_token_id, bos, eos)


# Eleven parameters: everything a run's start decides from (its config, directory, data,
# machine, resume) handed over once, so that Recipe.setup reads as its steps.
def _start(
    run: RunConfig,
    run_dir: Path,
    prepared: Data | None,
    base: Model | None,
    world: World,
    fit: FitTable | None,
    no_fit: str,
    kept: MachineRecord | None,
    resume: bool,
    force: bool,
    progress: bool,
) -> tuple[Data, RunConfig, MachineRecord]:
    """A new run's data (``prepared``, or read now with ``base``'s tokenizer when fine-tuning),
    its model fitted to the machine when ``fit`` is given (or as ``kept``, the record of a run
    resumed before its first checkpoint), and its config, machine record and tokenizer written
    into ``run_dir`` once they are known to make batches (not before: a run refused until then
    leaves nothing behind)."""
    base_config = None if base is None else base.config
    tokenizer = None if base is None else base.tokenizer
    data = prepared or load_data(run, tokenizer, _model_specials(run, base_config, tokenizer), progress)
    record = kept
    if record is None:
        precision, reason = distributed.precision_choice(run.train.precision, world.device, run.train.cpu_class)
        choice = None if fit is None else _probe(run, data, fit, world, precision)
        cpu = cpu_class(run.train.cpu_class)
        fitted = None if choice is None else choice.to_dict()
        record = MachineRecord(cpu.name, cpu.detected, cpu.forced_by, precision, reason, fitted, no_fit)
    if record.fit is not None:
        run = apply_overrides(run, record.fit["changes"])
    train_batches(run, data)
    run = model_config_for(run, data, None if base is None else base.config)
    prepare_run_dir(run_dir, resume, force)
    write_run_config(run_dir, run, record.to_dict())
    data.tokenizer.save(str(run_dir / TOKENIZER))
    return data, run, record


def _read_run(run_dir: Path) -> tuple[RunConfig, MachineRecord | None]:
    """The run config of ``run.json`` and its machine record (None for runs written before it)."""
    run, machine = read_run_config(run_dir)
    return run, None if machine is None else MachineRecord(**machine)


PROBE_STEPS = 5  # batches each candidate trains on twice: once to warm up, once timed


def _probe(run: RunConfig, data: Data, table: FitTable, world: World, precision: str) -> FitChoice:
    """Measure each candidate of ``table``'s training step on this machine and choose: its model,
    built, trains on the batches of the run's first :data:`PROBE_STEPS` steps (the same for all) twice, and
    the second pass is timed. The first meets each batch shape for the first time (bf16 kernels
    are made then: the demo's first steps took 1.5 times the steady step) and allocates."""
    start = time.perf_counter()
    plain = dataclasses.replace(run.data, curriculum_max_tokens=None)  # every candidate on the same batches
    batches = train_batches(dataclasses.replace(run, data=plain), data)
    per_step = run.train.batches_per_step
    steps = list(itertools.islice(iter(StepBatches(batches, 0, 1, per_step)), PROBE_STEPS))
    example_costs = batches.lengths  # each example's cost, as the batches were packed by
    typical = per_step * statistics.fmean(batch_positions(b, example_costs) for b in batches.epoch_arrays(0))

    def step_of(candidate: Candidate) -> Callable[[], float]:
        cand = dataclasses.replace(model_config_for(apply_overrides(run, candidate.changes), data), data=plain)
        model = build_model(cand.model).to(world.device)
        # A trainer that writes nothing (no metrics, no checkpoint): only its step is used.
        objective = make_objective(cand, data.specials)
        trainer = Trainer(
            cand, Path("."), model, objective, data.train, iter(steps), World(world.device), precision=precision
        )
        cycle = itertools.cycle(steps)

        def one() -> float:
            step_batches = next(cycle)
            trainer.step(step_batches)
            return sum(batch_positions(b, example_costs) for b in step_batches) / typical  # its size / a typical step's

        return one

    seconds = measure(table.candidates, step_of, steps=PROBE_STEPS, warm=PROBE_STEPS)
    choice = choose(table, seconds, run.train.time_budget or 0.0, run.train.max_steps)
    return dataclasses.replace(choice, probe_seconds=time.perf_counter() - start)


def make_objective(run: RunConfig, specials: Specials | None) -> Objective:
    if run.objective == "classify":  # padding is masked: a model without a pad id (GPT-2's) pads with eos, or 0
        model = run.model
        return Classify(next((i for i in (model.pad_token_id, model.eos_token_id) if i is not None), 0))
    if specials is None:
        raise ValueError(f"the {run.objective} objective needs attnkit's special tokens in the tokenizer")
    if run.objective == "translation":
        return Translation(specials, label_smoothing=run.train.label_smoothing)
    if run.objective == "causal_lm":
        return CausalLM(specials)
    if run.objective == "masked_lm":
        return MaskedLM(specials)
    return SpanCorruption(specials)


# The model keys a fine-tuning run (train.init) takes from its own config: adapters, and a
# classifier's head; every other one is the pretrained model's (:func:`model_config_for`).
TUNING_KEYS = ("lora_rank", "lora_alpha", "lora_targets")
CLASSIFIER_KEYS = ("dropout", "classifier_pooling")


def ignored_by_fine_tuning(run: RunConfig, keys: Iterable[str]) -> list[str]:
    """The ``model.*`` keys among ``keys`` (overrides) that a fine-tuning run would not use:
    the pretrained model's shape replaces them."""
    kept = {*TUNING_KEYS, *(CLASSIFIER_KEYS if run.objective == "classify" else ())}
    return [k for k in keys if k.startswith("model.") and k.removeprefix("model.") not in kept]


def model_config_for(run: RunConfig, data: Data, base: ModelConfig | None = None) -> RunConfig:
    """The run with the model's vocabulary and special ids taken from the tokenizer; a
    fine-tuning run's model is ``base`` (the pretrained one's) with the task's head added."""
    lora = {key: getattr(run.model, key) for key in TUNING_KEYS}
    if run.objective == "classify":
        head = dict(labels=data.labels, lm_head=False, classifier_pooling=run.model.classifier_pooling)
        if base is not None:  # the pretrained model with the task's head, and adapters if asked
            model = base.replace(dropout=run.model.dropout, **head, **lora)
            return RunConfig(model=model, train=run.train, data=run.data)
        if run.train.init is not None or data.specials is None:  # resumed: run.json holds the model already
            return RunConfig(model=run.model.replace(**head), train=run.train, data=run.data)
        pad = data.specials.pad
        model = run.model.replace(vocab_size=data.tokenizer.get_vocab_size(), pad_token_id=pad, **head)
        return RunConfig(model=model, train=run.train, data=run.data)
    if run.train.init is not None:  # fine-tuning: the pretrained model, with adapters if asked
        if base is None:  # resumed: run.json holds the model already
            return run
        return RunConfig(model=base.replace(**lora), train=run.train, data=run.data)
    s = data.specials
    assert s is not None
    model = run.model.replace(
        vocab_size=data.tokenizer.get_vocab_size(), pad_token_id=s.pad, bos_token_id=s.bos, eos_token_id=s.eos,
        decoder_start_token_id=s.bos if run.model.is_encoder_decoder else None,
    )  # fmt: skip
    return RunConfig(model=model, train=run.train, data=run.data)


def _copy_pretrained(model: torch.nn.Module, base: torch.nn.Module) -> None:
    """Copy ``base``'s parameters into ``model`` where both have them (the encoder); the parts
    only ``model`` has (a new classification head) keep their initialisation."""
    mine = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in base.named_parameters():
            if name in mine and mine[name].shape == tensor.shape:
                mine[name].copy_(tensor)


def check_run_dir(run_dir: Path, resume: bool, force: bool) -> bool:
    """Refuse a run directory that would be written over without ``resume`` or ``force``;
    whether it holds a run. Changes nothing."""
    if run_dir.exists() and not run_dir.is_dir():
        raise FileExistsError(f"{run_dir} exists and is not a directory; choose another --out")
    has_run = (run_dir / RUN_CONFIG).exists() or (run_dir / CHECKPOINTS).exists()
    if has_run and not (resume or force):
        raise FileExistsError(
            f"{run_dir} already holds a run; pass --resume to continue it, --force to start it over, "
            "or choose another --out"
        )
    if run_dir.is_dir() and not has_run and any(run_dir.iterdir()):
        raise FileExistsError(f"{run_dir} is not empty and holds no run; choose an empty or new --out")
    return has_run


def prepare_run_dir(run_dir: Path, resume: bool, force: bool) -> None:
    """Refuse to write over an existing run unless asked to resume it or start it over; then
    clear what an interrupted save left (resume) or the run started over (force)."""
    has_run = check_run_dir(run_dir, resume, force)
    if has_run and resume:
        for leftover in remove_interrupted(run_dir):
            log.info("removed %s, left by a save that was interrupted", leftover)
        latest = latest_checkpoint(run_dir)
        dropped = trim_metrics(run_dir, checkpoint_step(latest) if latest else 0)
        if dropped:
            log.info("dropped %d metrics records written after the last checkpoint; they are trained again", dropped)
    if has_run and force and not resume:
        for name in (CHECKPOINTS, METRICS, RUN_CONFIG, TOKENIZER):
            target = run_dir / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)


# What a resumed run may change: when to stop and how often to report, and how the work of a
# step is spread: the engine (checkpoints hold full, unsharded state) and batches_per_step, which
# goes with the world size, itself free to change: W processes with batches_per_step=k resume
# exactly what W*k batches per step trained (a change of W*k is allowed, with a warning).
RESUMABLE_CHANGES = frozenset(
    {"max_steps", "time_budget", "checkpoint_every", "keep_checkpoints", "eval_every", "eval_batches", "log_every"}
    | {"distributed", "batches_per_step", "skip_nonfinite", "compile", "cpu_class", "fit"}
)


def _resumed_config(saved: RunConfig, requested: RunConfig) -> RunConfig:
    """The saved run, with the changes a resume may make taken from ``requested``. A fine-tuning
    run's model is the pretrained one it started from (its preset's model section is a stand-in)."""
    if saved.train.init is not None:
        requested = RunConfig(model=saved.model, train=requested.train, data=requested.data)
    changed = [
        f"{section}.{key}"
        for section in ("model", "train", "data")
        for key, value in dataclasses.asdict(getattr(requested, section)).items()
        if getattr(getattr(saved, section), key) != value and not (section == "train" and key in RESUMABLE_CHANGES)
    ]
    if changed:
        raise ValueError(
            f"the run was started with other values of {', '.join(changed)}; resume with the same options "
            f"(only train.{{{','.join(sorted(RESUMABLE_CHANGES))}}} may change)"
        )
    train_changes = {k: getattr(requested.train, k) for k in RESUMABLE_CHANGES}
    return RunConfig(model=saved.model, train=dataclasses.replace(saved.train, **train_changes), data=saved.data)


class Recipe:
    """One training run in the shape of torchtune's recipes: :meth:`setup` joins the world and
    makes the run directory, the data, the model (new, fine-tuned from ``train.init``, or resumed
    from the run's latest complete checkpoint) and its trainer; :meth:`train` trains it and
    evaluates the end; :meth:`close` leaves the world. :func:`train` runs the three.

    ``resume``, ``force``, ``data``, ``fit``, ``no_fit`` and ``announce`` are :func:`train`'s."""

    def __init__(
        self,
        run: RunConfig,
        run_dir: Path,
        resume: bool = False,
        force: bool = False,
        data: Data | None = None,
        fit: FitTable | None = None,
        no_fit: str = "",
        announce: Callable[[str], None] | None = None,
    ) -> None:
        self.run, self.run_dir, self.resume, self.force = run, run_dir, resume, force
        self.prepared, self.fit, self.no_fit = data, fit, no_fit
        self.say = announce or (lambda line: log.info("%s", line))
        self.world: World | None = None  # joined by setup, left by close

    def setup(self, progress_bar: bool = True, stop: threading.Event | None = None) -> None:
        """Everything up to the first step; ``stop``, once set, ends training after a step (with
        a checkpoint)."""
        self.world = world = distributed.init_world(self.run.train.device)
        # An unknown or impossible CPU class, or fp16 on a CPU, is refused before anything is written.
        distributed.precision_choice(self.run.train.precision, world.device, self.run.train.cpu_class)
        if world.distributed and self.fit is not None:
            self.fit, self.no_fit = None, "a distributed run (size the model with --model.* options)"
        # Under torchrun rank 0 alone prepares the directory and, for a new run, trains the
        # tokenizer and writes it; the other ranks wait, then read that same tokenizer back.
        distributed.on_main(world, self._check_or_tidy)
        checkpoint = latest_checkpoint(self.run_dir) if self.resume else None
        if self.resume and checkpoint is None and world.is_main:
            log.warning("no complete checkpoint in %s: starting from the beginning", self.run_dir)
        base = init_model(self.run) if checkpoint is None else None  # a resumed run's weights are its own
        precision = self._data(checkpoint, base, progress_bar)
        self.model = self._model(base)
        resumed = None
        if checkpoint is not None:  # into the bare model, before DDP or FSDP take it over
            weights, optimizer_state, state = load_checkpoint(checkpoint)
            load_weights(self.model, weights, str(checkpoint))
            resumed = optimizer_state, state
        self.objective = make_objective(self.run, self.data.specials)
        self.trainer = self._trainer(stop, precision)
        if resumed is not None:
            self._resume(*resumed)
        if base is not None:  # where fine-tuning starts from: the pretrained model's validation scores
            before = evaluate(self.model, self.objective, self.data.valid, self.run, self.data.tokenizer)
            if world.is_main:
                self.trainer.write_metrics({"split": "valid", "step": 0, "before_fine_tuning": True, **before})
                log.info(
                    "before fine-tuning: validation loss %.4g, perplexity %.4g", before["loss"], before["perplexity"]
                )

    def train(
        self, progress_bar: bool = True, session_steps: int | None = None, progress_every: float = 30.0
    ) -> tuple[Progress, dict[str, float]]:
        """Train to the run's end (or ``session_steps`` more steps); where it ended, and the final
        evaluation on the validation split."""
        progress = self.trainer.fit(progress_bar, session_steps, progress_every)
        final = evaluate(self.model, self.objective, self.data.valid, self.run, self.data.tokenizer, bleu=True)
        if self.world.is_main:
            self.trainer.write_metrics({"split": "valid", "step": progress.step, "final": True, **final})
        return progress, final

    def close(self) -> None:
        """Leave the world :meth:`setup` joined (the process group under torchrun); a no-op after
        a setup that failed before joining."""
        if self.world is not None:
            distributed.close_world(self.world)
            self.world = None

    def _check_or_tidy(self) -> None:
        """A resumed run is tidied; a new one is made once it is known to start (:func:`_start`)."""
        if check_run_dir(self.run_dir, self.resume, self.force) and self.resume:
            prepare_run_dir(self.run_dir, self.resume, self.force)

    def _data(self, checkpoint: Path | None, base: Model | None, progress_bar: bool) -> str | None:
        """The run's data and its final config (a new run's written into the run directory, a
        resumed one's read from there); the precision the run chose, None for the trainer to."""
        world, run_dir, run, data, saved, record = self.world, self.run_dir, self.run, None, None, None
        if checkpoint is None:
            # Resumed before its first checkpoint: the choices its run.json records are kept.
            kept = _read_run(run_dir)[1] if self.resume and (run_dir / RUN_CONFIG).exists() else None
            started = distributed.on_main(
                world,
                lambda: _start(
                    run, run_dir, self.prepared, base, world, self.fit, self.no_fit, kept, self.resume, self.force,
                    progress_bar,
                ),
            )  # fmt: skip
            if started is not None:
                data, run, record = started
                for line in record.describe():
                    self.say(line)
        if data is None:  # resumed, or another rank of a new run
            saved, record = _read_run(run_dir)
            tokenizer = load_tokenizer(run_dir / TOKENIZER)
            specials = _model_specials(saved, saved.model, tokenizer)
            data = self.prepared or load_data(run, tokenizer, specials, progress_bar and world.is_main)
            if record is not None and record.fit is not None:  # the machine's choice, kept
                run = apply_overrides(run, record.fit["changes"])
            if checkpoint is not None and record is not None and world.is_main:
                self.say(f"resumed: the run keeps the choices it made on {record.cpu_class}: {record.precision}"
                         + (f", {record.fit['chosen']}" if record.fit else ""))  # fmt: skip
        run = model_config_for(run, data, None if base is None else base.config)
        if checkpoint is not None:  # a resumed run keeps its config, but for when to stop and report
            run = _resumed_config(saved, run)
        self.run, self.data = run, data
        return record.precision if record is not None else None

    def _model(self, base: Model | None) -> Model:
        """The run's model on its device: new, or ``base``'s weights with the task's head as
        initialised and then any adapters (fine-tuning)."""
        run, device = self.run, self.world.device
        torch.manual_seed(run.train.seed)  # the initial weights
        if base is None:
            return build_model(run.model).to(device)
        model = build_model(run.model.replace(lora_rank=0))
        _copy_pretrained(model, base)
        if run.model.lora_rank:
            lora.add(model, run.model.lora_rank, run.model.lora_alpha, run.model.lora_targets)
            if getattr(model, "classifier", None) is not None:  # a new head learns whole beside the adapters
                model.classifier.requires_grad_(True)
        model.config = run.model
        return model.to(device)

    def _trainer(self, stop: threading.Event | None, precision: str | None) -> Trainer:
        run, data, model, objective, world = self.run, self.data, self.model, self.objective, self.world
        batches = train_batches(run, data)
        self.batches = iter(StepBatches(batches, world.rank, world.size, run.train.batches_per_step))
        return Trainer(
            run, self.run_dir, model, objective, data.train, self.batches, world,
            evaluate=lambda: evaluate(model, objective, data.valid, run, data.tokenizer, bleu=True), stop=stop,
            precision=precision, announce=self.say,
        )  # fmt: skip

    def _resume(self, optimizer_state: dict[str, Any], state: dict[str, Any]) -> None:
        """The trainer where the checkpoint left it: the optimiser's state, the progress and the
        position in the data."""
        trainer, batches = self.trainer, self.batches
        distributed.load_optimizer(trainer.model, trainer.optimizer, optimizer_state)
        trainer.progress = Progress(**state["progress"])
        if trainer.progress.step_batches != batches.source.group and self.world.is_main:
            log.warning(
                "the run's steps trained on %d batches (world size x train.batches_per_step); these train on "
                "%d: a different batch per update, and the data order continues approximately",
                trainer.progress.step_batches, batches.source.group,
            )  # fmt: skip
        batches.load_state_dict(trainer.progress.data)
        log.info("resumed %s at step %d", self.run_dir, trainer.progress.step)


def train(  # twelve parameters: the one call of the command line, the chapter and the benchmarks
    run: RunConfig,
    run_dir: str | Path,
    resume: bool = False,
    force: bool = False,
    progress_bar: bool = True,
    session_steps: int | None = None,
    stop: threading.Event | None = None,
    progress_every: float = 30.0,
    data: Data | None = None,
    fit: FitTable | None = None,
    no_fit: str = "",
    announce: Callable[[str], None] | None = None,
) -> tuple[Progress, dict[str, float]]:
    """Train ``run`` into ``run_dir``; returns where it ended and the final evaluation.

    ``resume`` continues the run's latest complete checkpoint (or starts from the beginning
    when there is none); ``session_steps`` stops this call after that many steps, with a
    checkpoint, so that a later ``resume`` picks up exactly there. Setting ``stop`` (from a
    signal handler, or another thread) ends training after the current step with a checkpoint:
    :class:`~attnkit.training.trainer.TrainingStoppedError` is raised. ``data``, a corpus
    prepared once for several runs (:func:`attnkit.data.prepare.load_data`), is trained on
    instead of reading the run's corpus and training its tokenizer.

    A new run resolves its precision on this machine and, with ``fit`` (a preset's table,
    :func:`attnkit.training.fit.fit_for`), measures the table's candidates here and trains the
    best one for its budget (``no_fit``: why it is not fitted, for the record); both are saved
    in ``run.json`` and kept on resume. ``announce`` receives those choices as lines (the
    command line prints them; by default they are logged)."""
    recipe = Recipe(run, Path(run_dir), resume, force, data, fit, no_fit, announce)
    try:
        recipe.setup(progress_bar, stop)
        return recipe.train(progress_bar, session_steps, progress_every)
    finally:
        recipe.close()
