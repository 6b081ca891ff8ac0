"""A training run's configuration: how to train (:class:`TrainConfig`), on what
(:class:`DataConfig`), and the whole of it with its model (:class:`RunConfig`), saved as
``run.json`` in the run directory; and each family's pretraining objective."""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any, Literal

from attnkit.config.bible import check_tasks, language_weights
from attnkit.config.model import ModelConfig, from_dict
from attnkit.config.typed import build, check_types

Objective = Literal["translation", "causal_lm", "masked_lm", "span_corruption", "classify"]

# Each family's pretraining objective [tab:att-families] (translation: the paper's task).
OBJECTIVES: dict[str, Objective] = {
    "transformer": "translation",
    "gpt": "causal_lm",
    "bert": "masked_lm",
    "t5": "span_corruption",
}
# The families each objective trains (translation: either encoder–decoder; classify: an encoder,
# or GPT reading its last token, GPT-1's transfer).
OBJECTIVE_FAMILIES: dict[str, tuple[str, ...]] = {
    "translation": ("transformer", "t5"),
    "causal_lm": ("gpt",),
    "masked_lm": ("bert",),
    "span_corruption": ("t5",),
    "classify": ("bert", "gpt"),
}


@dataclass(frozen=True)
class TrainConfig:
    """How to train: optimiser, schedule, budget, precision, checkpoints."""

    objective: Objective | None = None  # None = the family's own
    # A model to fine-tune instead of random weights: a directory (attnkit's or Hugging Face's),
    # or a name of attnkit.loading.PRETRAINED (an installed package's model). Its architecture, weights and
    # tokenizer are the run's; the model section adds only what the task needs (labels).
    init: str | None = None
    max_steps: int = 1000  # optimiser steps
    time_budget: float | None = None  # seconds of training; stops at whichever comes first
    batch_tokens: int = 4096  # per batch; each process trains on batches_per_step per step (the paper: ~25,000)
    grad_accum: int = 1  # micro-batches per optimiser step (each of batch_tokens / grad_accum)
    # Batches of batch_tokens each process trains on per optimiser step: a step of W processes
    # trains on W * batches_per_step consecutive batches, the same at any W for the same product.
    batches_per_step: int = 1
    optimizer: Literal["adam", "adamw", "adafactor"] = "adam"  # adafactor: T5's (betas and eps are Adam's)
    lr: float = 2.0  # peak learning rate, or the Noam multiplier when schedule = "noam"
    betas: tuple[float, float] = (0.9, 0.98)  # the paper's
    eps: float = 1e-9  # the paper's
    weight_decay: float = 0.0
    # budget-linear / budget-cosine: warm-up, then decay to min_lr_ratio at the end of time_budget;
    # the horizon in steps is fixed once from the step rate measured over the warm-up
    # (training.schedule.budget_horizon) and saved with every checkpoint, so resuming follows it.
    # warmup-constant: a linear warm-up, then the peak rate to the end (constant: the peak from step 1).
    schedule: Literal["noam", "cosine", "constant", "warmup-constant", "budget-linear", "budget-cosine"] = "noam"
    warmup: int = 4000  # steps
    min_lr_ratio: float = 0.1  # cosine, budget-*: floor as a fraction of the peak
    clip_norm: float | None = 1.0  # gradient clipping; None = off
    # Steps whose loss is NaN or infinite that may be skipped (no update, counted as "skipped" in
    # the metrics) before training stops with the step number; 0 = stop at the first.
    skip_nonfinite: int = 0
    label_smoothing: float = 0.1  # translation only (the paper's ε_ls)
    # bf16/fp16: autocast (fp16 on GPU, with a scaler); auto: bf16 where the hardware computes it natively
    precision: Literal["fp32", "bf16", "fp16", "auto"] = "fp32"
    # The CPU class to act as (attnkit.machine): auto = this CPU's, or $ATTNKIT_CPU_CLASS when set; a
    # lower class (e.g. avx2 on an AVX512-BF16 CPU) takes its paths: fp32 for precision=auto, its fit.
    cpu_class: Literal["auto", "avx512-bf16", "avx512", "avx2", "x86-64", "arm64"] = "auto"
    # Presets with a wall-clock budget and a machine-fit table (attnkit.training.fit) measure each
    # candidate model's step here and train the one their study found best for the updates it affords.
    fit: bool = True
    seed: int = 0
    checkpoint_every: int = 500  # steps
    keep_checkpoints: int = 5  # the last k complete checkpoints are kept
    eval_every: int = 500  # steps; 0 = only at the end
    eval_batches: int = 20  # validation batches per evaluation
    log_every: int = 10  # steps between metric lines
    distributed: Literal["ddp", "fsdp"] = "ddp"  # under torchrun
    device: str = "auto"  # "auto", "cpu", "cuda", "cuda:1", ...
    compile: bool = False  # torch.compile the model (the first step's compile time goes to metrics.jsonl)

    def __post_init__(self) -> None:
        check_types(self)
        for name in (
            "max_steps",
            "batch_tokens",
            "grad_accum",
            "batches_per_step",
            "checkpoint_every",
            "keep_checkpoints",
            "eval_batches",
            "log_every",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup", "eval_every", "skip_nonfinite"):
            if getattr(self, name) < 0:
                raise ValueError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        if self.schedule == "noam" and self.warmup < 1:
            raise ValueError("train.warmup must be >= 1 with the Noam schedule (it divides by warmup^1.5)")
        if self.lr <= 0 or self.eps <= 0 or self.weight_decay < 0:
            raise ValueError(f"train.lr ({self.lr}) and train.eps ({self.eps}) must be > 0, weight_decay >= 0")
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"train.betas must be in [0, 1), got {self.betas}")
        if not 0.0 <= self.label_smoothing < 1.0 or not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError("train.label_smoothing must be in [0, 1) and train.min_lr_ratio in [0, 1]")
        if self.time_budget is not None and self.time_budget <= 0:
            raise ValueError(f"train.time_budget must be > 0 seconds, got {self.time_budget}")
        if self.schedule.startswith("budget-") and self.time_budget is None:
            raise ValueError(
                f"train.schedule={self.schedule} decays to the end of the time budget, but train.time_budget is "
                "null; set --train.time_budget=SECONDS, or use --train.schedule=cosine (decays over train.max_steps)"
            )
        if self.clip_norm is not None and self.clip_norm <= 0:
            raise ValueError(f"train.clip_norm must be > 0 or null, got {self.clip_norm}")
        if self.batch_tokens < self.grad_accum:
            raise ValueError(
                f"train.batch_tokens ({self.batch_tokens}) must be >= train.grad_accum ({self.grad_accum})"
            )


@dataclass(frozen=True)
class DataConfig:
    """What to train on. ``corpus="files"``: ``path`` holds plain-text files (one document or
    sentence per line) for the language-model objectives, tab-separated source/target files for
    translation, ``text<TAB>label`` files for classification. ``"bible"``: aligned public-domain
    Bibles (see :mod:`attnkit.data.corpora`), split by whole chapters. ``"numbers"``: number
    words from num2words. ``"testament"`` and ``"books"`` (classification): which Testament, or
    which of the 66 books, a verse of ``source``'s Bible is from, split by whole chapters."""

    corpus: Literal["files", "bible", "numbers", "testament", "books"] = "files"  # files: data.path; others built in
    path: tuple[str, ...] = ()
    source: str = "4"  # bible: source translation (4 = World English); numbers: source language (num2words)
    target: str = "l"  # bible: target translation (l = Louis Segond 1910); numbers: target language
    bibles: tuple[str, ...] = ("k", "4")  # bible, language models: the translations read as plain text
    # bible, translation: text-to-text tasks trained together instead of source -> target, each
    # source prefixed with its task as T5's are (attnkit.config.bible.TASKS), e.g. "modernize".
    tasks: tuple[str, ...] = ()
    # bible tasks: how many times each task's training pairs are read per epoch, in data.tasks'
    # order (2 = twice; 0.5 = a seeded random half of them, the same half every epoch); () = once
    # each. Held-out splits are never weighed.
    task_weights: tuple[float, ...] = ()
    numbers: int = 20000  # numbers: how many (0 .. numbers-1)
    tokenizer: str | None = None  # a tokenizer.json to use; None = train a byte-level BPE on the data
    vocab_size: int = 8000  # when training the tokenizer
    # bible: how many times the tokenizer reads each language's training text, as LANG=WEIGHT
    # (e.g. fr=3: a bigger share of the vocabulary for French); () = once each.
    tokenizer_weights: tuple[str, ...] = ()
    max_tokens: int = 128  # longer examples are truncated
    # Train on this many of the training examples (a seeded choice, in proportion to each class
    # for classification: attnkit.data.batching.few_examples); None = all. Fine-tuning with few labels.
    train_examples: int | None = None
    valid_fraction: float = 0.02  # held out for evaluation
    # A short-example curriculum: the first curriculum_epochs epochs train only on the examples
    # of at most curriculum_max_tokens padded positions (specials included); None = none.
    curriculum_max_tokens: int | None = None
    curriculum_epochs: int = 1

    def __post_init__(self) -> None:
        check_types(self)
        if self.curriculum_max_tokens is not None and self.curriculum_max_tokens < 2:
            raise ValueError(
                f"data.curriculum_max_tokens must be >= 2 (a token and its special) or null, got "
                f"{self.curriculum_max_tokens}"
            )
        if self.curriculum_epochs < 1:
            raise ValueError(
                f"data.curriculum_epochs must be >= 1, got {self.curriculum_epochs} (no curriculum: "
                "curriculum_max_tokens=null)"
            )
        if self.vocab_size < 300 or self.max_tokens < 4:
            raise ValueError(
                f"data.vocab_size must be >= 300 (bytes + specials) and data.max_tokens >= 4, got "
                f"{self.vocab_size} and {self.max_tokens}"
            )
        if self.train_examples is not None and self.train_examples < 1:
            raise ValueError(
                f"data.train_examples must be >= 1 (or null for every training example), got {self.train_examples}"
            )
        if not 0.0 < self.valid_fraction < 0.5:
            raise ValueError(f"data.valid_fraction must be in (0, 0.5), got {self.valid_fraction}")
        if self.tasks:
            if self.corpus != "bible":
                raise ValueError(
                    f"data.tasks are Bible text-to-text tasks; set data.corpus=bible (got {self.corpus!r})"
                )
            check_tasks(self.tasks)
        if self.task_weights and not self.tasks:
            raise ValueError(
                f"data.task_weights={list(self.task_weights)} weigh data.tasks, and this run has none; set "
                "data.tasks (with data.corpus=bible) or drop data.task_weights"
            )
        if self.task_weights and len(self.task_weights) != len(self.tasks):
            raise ValueError(
                f"data.task_weights={list(self.task_weights)} needs one weight per task of data.tasks "
                f"({len(self.tasks)}: {list(self.tasks)})"
            )
        if any(not w > 0 for w in self.task_weights):
            raise ValueError(
                f"data.task_weights must all be > 0, got {list(self.task_weights)}; drop a task from data.tasks instead"
            )
        if self.tokenizer_weights:
            if self.corpus != "bible":
                raise ValueError(
                    f"data.tokenizer_weights weigh the Bibles' languages; set data.corpus=bible (got {self.corpus!r})"
                )
            language_weights(self.tokenizer_weights)
            if self.tokenizer:
                raise ValueError(
                    f"data.tokenizer_weights shape a tokenizer attnkit trains, but data.tokenizer={self.tokenizer} "
                    "is given; drop one of them"
                )


@dataclass(frozen=True)
class RunConfig:
    """Everything a training run needs; saved as ``run.json`` in the run directory."""

    model: ModelConfig
    train: TrainConfig = TrainConfig()
    data: DataConfig = DataConfig()

    def __post_init__(self) -> None:
        if why := objective_mismatch(self.objective, self.model.family):
            raise ValueError(f"train.objective={self.objective}: {why}")
        if self.data.tokenizer_weights and self.objective != "translation":
            raise ValueError(
                f"data.tokenizer_weights weigh the languages of translation pairs, and this run's objective is "
                f"{self.objective}; drop data.tokenizer_weights"
            )
        if self.data.tokenizer_weights and self.train.init:
            raise ValueError(
                f"data.tokenizer_weights shape a tokenizer attnkit trains, but train.init={self.train.init} brings "
                "its own; drop one of them"
            )

    @property
    def objective(self) -> Objective:
        return self.train.objective or OBJECTIVES[self.model.family]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def objective_mismatch(objective: str, family: str) -> str | None:
    """None where ``objective`` trains ``family`` models; otherwise why not, and the fix."""
    families = OBJECTIVE_FAMILIES[objective]
    if family in families:
        return None
    return (
        f"the {objective} objective trains {' or '.join(families)} models, not {family}; use a {families[0]} "
        f"model, or --train.objective={OBJECTIVES[family]} ({family}'s own)"
    )


def run_from_dict(data: Any) -> RunConfig:
    if not isinstance(data, dict):
        raise ValueError(f"a run config must be a mapping, got {type(data).__name__}")
    # "machine": a run directory's record of the machine it was fitted to (attnkit.training.fit), not config.
    unknown = sorted(set(data) - {"model", "train", "data", "machine"})
    if unknown:
        close = difflib.get_close_matches(unknown[0], ["model", "train", "data"], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown run config section {unknown[0]!r}{hint} (sections: model, train, data)")
    if "model" not in data:
        raise ValueError("a run config needs a 'model' section")
    return RunConfig(
        model=from_dict(data["model"]),
        train=build(TrainConfig, data.get("train", {}), "train"),
        data=build(DataConfig, data.get("data", {}), "data"),
    )
