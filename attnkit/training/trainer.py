"""The training loop: plain and readable, one optimiser step per iteration.

Each step draws ``train.batches_per_step`` batches of example indices per process, splits
each into ``grad_accum`` micro-batches, and normalises the summed token losses by the number
of target tokens over all micro-batches and processes, so accumulation and data parallelism
give the gradient of one big batch. All randomness of a step (dropout, masking) is seeded from
(seed, step, which of the step's batches, micro-batch), so a run resumed from a checkpoint
continues exactly as if it had never stopped, and ``W`` processes with ``batches_per_step=k``
train exactly as one process with ``batches_per_step=W*k`` (up to floating-point summation order).

Stopping early is asked for with a ``stop`` event, checked between steps: the trainer finishes
the step under way (its log, evaluation and checkpoint included), writes a checkpoint and raises
:class:`TrainingStoppedError`. It installs no signal handler; ``attnkit train`` sets the event on
SIGINT or SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnkit.config import RunConfig
from attnkit.data.batching import StepIterator
from attnkit.machine import compile_cache
from attnkit.models.run_dir import checkpoint_dir
from attnkit.objectives.base import IGNORE_INDEX, LossOutput, Objective
from attnkit.progress import ProgressReport
from attnkit.training import distributed
from attnkit.training.checkpoint import save_checkpoint
from attnkit.training.distributed import World
from attnkit.training.schedule import budget_horizon, horizon_probe, learning_rate

log = logging.getLogger(__name__)

METRICS = "metrics.jsonl"


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite, at more steps than ``train.skip_nonfinite`` lets the
    trainer skip (a skipped step updates nothing; every rank skips it alike)."""


class TrainingStoppedError(Exception):
    """Training stopped early, as its ``stop`` event asked, after writing ``checkpoint`` of
    ``step`` (``None`` when stopped before the first step, or on a rank that does not write)."""

    def __init__(self, step: int, checkpoint: Path | None) -> None:
        super().__init__(f"training stopped at step {step}")
        self.step, self.checkpoint = step, checkpoint


@dataclass
class Progress:
    """Where a run stands; saved in every checkpoint."""

    step: int = 0
    tokens: int = 0  # target tokens trained on, over all processes
    seconds: float = 0.0  # training time so far, over all sessions of the run
    data: dict[str, int] = field(default_factory=dict)  # the batch iterator's position
    step_batches: int = 1  # batches per step over all processes: world size x train.batches_per_step
    skipped: int = 0  # steps skipped for a non-finite loss (train.skip_nonfinite)
    horizon: int | None = None  # budget schedules: the step their decay ends at, fixed once


def step_seed(seed: int, step: int, shard: int, micro: int) -> int:
    """The seed of one micro-batch: a function of where it is, not of what ran before.
    ``shard``: which of the step's batches over all processes (rank * batches_per_step + j),
    so the seed does not depend on how the step's batches are spread over processes."""
    return (seed * 1_000_003 + step * 4_099 + shard * 131 + micro) % (2**63 - 1)


def make_optimizer(model: nn.Module, run: RunConfig) -> torch.optim.Optimizer:
    """Adam or AdamW (``train.betas``, ``train.eps``), or T5's Adafactor: factored second
    moments, no momentum, and each step relative to the parameter's own scale — the step is
    max(1e-3, RMS(θ)) × min(lr, 1/√t), so an embedding drawn N(0, 1) and a query matrix drawn
    N(0, (d_model·d_k)^-0.5) move by the same fraction of themselves (Shazeer and Stern, 2018)."""
    cfg = run.train
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]  # matrices and embeddings
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]  # biases and norms' γ, β
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if cfg.optimizer == "adafactor":
        return torch.optim.Adafactor(groups, lr=cfg.lr)
    cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    # One fused kernel per step instead of a loop over parameters (10% of a small translator's
    # step on the CPU; on a GPU, one launch instead of several per parameter); for FSDP's
    # sharded tensors and other devices, torch's own default.
    fused = all(p.device.type in ("cpu", "cuda") and type(p.data) is torch.Tensor for p in model.parameters()) or None
    return cls(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=fused)


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """A batch made on the CPU, on ``device``: to a GPU from pinned memory without waiting
    (the copy overlaps the step's work already queued); on the CPU, as it is."""
    if device.type != "cuda":
        return {k: v.to(device) for k, v in batch.items()}
    return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}


def _micro_batches(indices: Sequence[int], parts: int) -> list[list[int]]:
    """Split one batch's example indices into ``parts`` nearly equal, non-empty micro-batches."""
    parts = max(1, min(parts, len(indices)))
    size = math.ceil(len(indices) / parts)
    return [list(indices[i : i + size]) for i in range(0, len(indices), size)]


def _tensorboard(run_dir: Path) -> Any:
    """A TensorBoard writer in ``run_dir/tensorboard`` when the tensorboard package is installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(run_dir / "tensorboard"))


def trim_metrics(run_dir: Path, step: int) -> int:
    """Drop the records of ``metrics.jsonl`` after ``step``, which a run resumed from that step
    writes again, and a last line torn by a kill; returns how many lines were dropped."""
    path = run_dir / METRICS
    if not path.exists():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # the line a kill cut short
            continue
        if record["step"] <= step:
            kept.append(line)
    if len(kept) < len(lines):
        tmp = path.with_name(f".{METRICS}.tmp")
        tmp.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
        os.replace(tmp, path)
    return len(lines) - len(kept)


def padding_fraction(batches: Sequence[dict[str, torch.Tensor]]) -> float:
    """The share of the positions of ``batches`` that are padding, over every attention mask
    in them (source and target sides of an encoder-decoder batch alike)."""
    masks = [b[k] for b in batches for k in b if k.endswith("attention_mask")]
    positions = sum(m.numel() for m in masks)
    return 1.0 - sum(int(m.sum()) for m in masks) / positions if positions else 0.0


def _untrained_parameters(model: nn.Module, objective: Objective, example: Any) -> list[str]:
    """Names of the trainable parameters that the objective's loss on ``example`` does not reach."""
    was_training = model.training
    model.eval()
    batch = objective.batch([example], torch.Generator().manual_seed(0))
    device = next(model.parameters()).device
    objective.loss(model, {k: v.to(device) for k, v in batch.items()}).total.backward()
    untrained = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return untrained


class Trainer:
    """Runs optimiser steps until ``train.max_steps`` or ``train.time_budget``."""

    # Eleven parameters: a trainer is built once per run from what the recipe made (model, data,
    # objective, world, precision, the resumed progress); each is used, none is derived here.
    def __init__(
        self,
        run: RunConfig,
        run_dir: Path,
        model: nn.Module,
        objective: Objective,
        examples: Sequence[Any],
        batches: StepIterator,
        world: World,
        evaluate: Callable[[], dict[str, float]] | None = None,
        stop: threading.Event | None = None,
        precision: str | None = None,
        announce: Callable[[str], None] | None = None,
    ) -> None:
        """``precision``: what autocast runs (fp32, bf16, fp16), as the run chose it once (a
        resumed run keeps it); None resolves ``train.precision`` on this machine. ``announce``
        receives the choices made while training (a budget schedule's horizon) as lines;
        by default they are logged."""
        self.announce = announce or (lambda line: log.info("%s", line))
        self.run, self.run_dir, self.world = run, run_dir, world
        self.stop = stop
        self.bare = model  # the model itself, whatever wraps it
        self.parameter_names = [name for name, _ in model.named_parameters()]
        if world.distributed and run.train.distributed == "ddp":
            # DDP waits for a gradient of every trainable parameter at every step; one the loss
            # never reaches (BERT's pooler under MLM) gets none, and no update on its own either
            # (the optimiser skips it), so freezing it changes nothing but lets DDP run.
            untrained = _untrained_parameters(model, objective, examples[0])
            for name, p in model.named_parameters():
                if name in untrained:
                    p.requires_grad_(False)
            if untrained and world.is_main:
                log.info("not reached by the %s loss, so frozen under DDP: %s", objective.name, ", ".join(untrained))
        if run.train.compile:
            compile_cache()
            model.compile()  # in place: parameter names, checkpoints and the optimiser are unchanged
        self.model = distributed.wrap(model, world, run.train.distributed)
        self.optimizer = make_optimizer(self.model, run)
        self.objective, self.examples, self.batches = objective, examples, batches
        self.evaluate = evaluate
        self.progress = Progress()
        device = world.device.type
        self.precision = precision or distributed.resolve_precision(
            run.train.precision, world.device, run.train.cpu_class
        )
        self.autocast = (
            torch.autocast(device, dtype=torch.bfloat16 if self.precision == "bf16" else torch.float16)
            if self.precision != "fp32"
            else contextlib.nullcontext()
        )
        self.scaler = torch.amp.GradScaler(device, enabled=self.precision == "fp16")
        self._tensorboard: Any = None  # made at the first record (False: not installed); a probe's trainer writes none

    # -- one step -------------------------------------------------------------------------

    # One optimiser step as the chapter's loop reads it (forward, loss, backward, clip, update,
    # schedule), with accumulation and the non-finite guard agreed across ranks: kept whole.
    def step(self, step_batches: list[list[int]]) -> dict[str, float]:
        """One optimiser step on this process's batches of example indices (the training loop's,
        and the fit probe's: :func:`attnkit.training.run.train` with a fit table times these)."""
        cfg, step = self.run.train, self.progress.step + 1
        lr = learning_rate(step, cfg, self.run.model.d_model, self.progress.horizon)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batches, seeds = [], []
        for j, indices in enumerate(step_batches):
            shard = self.world.rank * len(step_batches) + j  # which of the step's batches, over all processes
            for micro, chunk in enumerate(_micro_batches(indices, cfg.grad_accum)):
                seeds.append(step_seed(cfg.seed, step, shard, micro))
                generator = torch.Generator().manual_seed(seeds[-1])
                batch = self.objective.batch([self.examples[i] for i in chunk], generator)
                batches.append(to_device(batch, self.world.device))
        # Target tokens of the whole step, over every micro-batch and process: the denominator.
        local_tokens = sum(int((b["labels"] != IGNORE_INDEX).sum()) for b in batches)
        padding = padding_fraction(batches)
        (global_tokens,) = distributed.all_sum([float(local_tokens)], self.world)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        outputs: list[LossOutput] = []
        for micro, batch in enumerate(batches):
            torch.manual_seed(seeds[micro])  # dropout
            last = micro == len(batches) - 1
            sync = contextlib.nullcontext() if last or not hasattr(self.model, "no_sync") else self.model.no_sync()
            with sync:
                with self.autocast:
                    out = self.objective.loss(self.model, batch)
                # DDP averages gradients over ranks: scale the sum so that the average is
                # d(total loss over every target token) / d(parameters) / (global tokens).
                loss = out.total * (self.world.size / max(global_tokens, 1.0))
                self.scaler.scale(loss).backward()
            outputs.append(out)
        loss_sum = sum(float(o.total.detach()) for o in outputs)
        metric_names = sorted({k for o in outputs for k in o.metrics})
        local = [loss_sum, float(local_tokens), *(sum(o.metrics.get(k, 0.0) for o in outputs) for k in metric_names)]
        total_loss, tokens, *metric_sums = distributed.all_sum(local, self.world)
        # The loss summed over ranks: every rank sees the same value, so all skip or all raise.
        if not math.isfinite(total_loss):
            self.progress.skipped += 1
            if self.progress.skipped > cfg.skip_nonfinite:
                raise NonFiniteLossError(
                    f"the loss became {total_loss} at step {step} ({self.progress.skipped - 1} such steps skipped "
                    f"before, train.skip_nonfinite={cfg.skip_nonfinite}); lower train.lr, raise train.warmup, use "
                    "train.precision=fp32, or let train.skip_nonfinite=N skip up to N such steps"
                )
            if self.world.is_main:
                log.warning("the loss became %s at step %d; skipped it without an update (%d of %d)",
                            total_loss, step, self.progress.skipped, cfg.skip_nonfinite)  # fmt: skip
            self.progress.step = step
            return {"step": step, "lr": lr, "loss": total_loss, "tokens": 0, "skipped": self.progress.skipped}
        self.scaler.unscale_(self.optimizer)
        grad_norm = (
            float(nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip_norm))
            if cfg.clip_norm is not None
            else float("nan")
        )
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.progress.step = step
        self.progress.tokens += int(tokens)
        stats = {"step": step, "lr": lr, "loss": total_loss / max(tokens, 1.0), "tokens": int(tokens)}
        stats["skipped"] = self.progress.skipped
        stats["padding"] = padding
        stats.update({f"{k}_rate": v / max(tokens, 1.0) for k, v in zip(metric_names, metric_sums, strict=True)})
        if cfg.clip_norm is not None:
            stats["grad_norm"] = grad_norm
        return stats

    # -- the loop -------------------------------------------------------------------------

    def save(self) -> Path | None:
        """A checkpoint of the current step (collective under torchrun; rank 0 writes)."""
        model_state, optim_state = distributed.full_state(self.model, self.optimizer, self.parameter_names)
        if not self.world.is_main:
            return None
        self.progress.data = self.batches.state_dict()
        self.progress.step_batches = self.batches.source.group
        return save_checkpoint(
            self.run_dir, self.progress.step, self.run.model.to_dict(), model_state, optim_state,
            {"progress": self.progress.__dict__}, self.run.train.keep_checkpoints,
        )  # fmt: skip

    def _fix_horizon(self, seconds_at: dict[int, float]) -> int:
        """Fix the budget schedule's horizon from the step rate so far (every rank the same:
        the ranks' clocks are averaged), record it, and return it."""
        averaged = distributed.all_sum(list(seconds_at.values()), self.world)
        seconds = {step: t / self.world.size for step, t in zip(seconds_at, averaged, strict=True)}
        horizon = budget_horizon(self.run.train, seconds)
        self.progress.horizon = horizon
        if self.world.is_main:
            cfg = self.run.train
            where = (
                f"train.max_steps (the {cfg.time_budget:.0f}-s budget would allow more here)"
                if horizon == cfg.max_steps
                else f"where the {cfg.time_budget:.0f}-s budget ends at this machine's step rate over the warm-up"
            )
            self.announce(f"schedule fit: {cfg.schedule} ends its decay at step {horizon:,}, {where}")
        self.write_metrics({"split": "schedule", "step": self.progress.step, "horizon": horizon})
        return horizon

    def write_metrics(self, record: dict[str, Any]) -> None:
        """Append ``record`` to metrics.jsonl (and TensorBoard, when installed); rank 0 only."""
        if not self.world.is_main:
            return
        with open(self.run_dir / METRICS, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        if self._tensorboard is None:
            self._tensorboard = _tensorboard(self.run_dir) or False
        if self._tensorboard:
            for key, value in record.items():
                if isinstance(value, float | int) and key != "step":
                    self._tensorboard.add_scalar(f"{record['split']}/{key}", value, record["step"])

    # The loop: steps, evaluation, checkpoints, stops and budgets in one place, in the order they
    # must happen; each is a call, the length is their interleaving.
    def fit(
        self, progress_bar: bool = True, session_steps: int | None = None, progress_every: float = 30.0
    ) -> Progress:
        """Train until ``train.max_steps``, the time budget, or ``session_steps`` steps in this
        call (then a checkpoint is written, and ``--resume`` continues exactly). The progress
        is a bar on a terminal, else a line every ``progress_every`` seconds. Raises
        :class:`TrainingStoppedError`, after a checkpoint, when the ``stop`` event is set."""
        cfg = self.run.train
        stop_at = cfg.max_steps if session_steps is None else min(cfg.max_steps, self.progress.step + session_steps)
        # The bar follows the limit that binds: the time budget in seconds, else the steps.
        by_time = cfg.time_budget is not None
        bar = ProgressReport(
            total=cfg.time_budget if by_time else stop_at, desc="training", unit="s" if by_time else "step",
            initial=self.progress.seconds if by_time else self.progress.step,
            enabled=progress_bar and self.world.is_main, every=progress_every,
        )  # fmt: skip
        session_start, trained_before = time.perf_counter(), self.progress.seconds
        tokens_since, clock = 0, time.perf_counter()
        checkpointed = self.progress.step  # the step the latest checkpoint holds (a new run needs none of step 0)
        stopped = False
        compiling = cfg.compile  # the session's first step traces and compiles: its time is reported
        probe = horizon_probe(cfg) if cfg.schedule.startswith("budget-") else None
        seconds_at: dict[int, float] = {}  # step -> training seconds at its end, until the horizon is fixed
        if self.progress.horizon is not None:
            stop_at = min(stop_at, self.progress.horizon)
            if self.progress.step >= self.progress.horizon and self.world.is_main:
                log.warning(
                    "%s: this run's decay ended at step %d, where it stands: more time does not train it further; "
                    "start a new run with a longer train.time_budget, or use train.schedule=noam",
                    cfg.schedule, self.progress.horizon,
                )  # fmt: skip
        try:
            while self.progress.step < stop_at:
                # Every rank must stop after the same step, whichever of them got the signal.
                stopped = distributed.any_rank(self.stop is not None and self.stop.is_set(), self.world)
                if stopped:
                    break
                step_start = time.perf_counter()
                stats = self.step(next(self.batches))
                if compiling:
                    compiling = False
                    seconds = time.perf_counter() - step_start
                    log.info("torch.compile: the first step took %.1f s", seconds)
                    self.write_metrics({"split": "compile", "step": self.progress.step, "compile_seconds": seconds})
                self.progress.seconds = trained_before + time.perf_counter() - session_start
                tokens_since += stats["tokens"]
                if probe is not None and self.progress.horizon is None:
                    seconds_at[self.progress.step] = self.progress.seconds
                    if self.progress.step == probe:
                        stop_at = min(stop_at, self._fix_horizon(seconds_at))
                bar.update(min(self.progress.seconds, cfg.time_budget) if by_time else self.progress.step)
                step = self.progress.step
                if step % cfg.log_every == 0 or step in (cfg.max_steps, self.progress.horizon):
                    now = time.perf_counter()
                    stats["tokens_per_s"] = tokens_since / max(now - clock, 1e-9)
                    tokens_since, clock = 0, now
                    bar.set_fields(
                        step=step,
                        loss=f"{stats['loss']:.3f}",
                        lr=f"{stats['lr']:.2e}",
                        tok_s=f"{stats['tokens_per_s']:.0f}",
                    )
                    self.write_metrics({"split": "train", **stats, "seconds": self.progress.seconds})
                out_of_time = cfg.time_budget is not None and self.progress.seconds >= cfg.time_budget
                out_of_time = distributed.any_rank(out_of_time, self.world)
                if self.evaluate is not None and cfg.eval_every and step % cfg.eval_every == 0:
                    self.write_metrics({"split": "valid", "step": step, **self.evaluate()})
                if step % cfg.checkpoint_every == 0 or out_of_time or step == stop_at:
                    self.save()
                    checkpointed = step
                if out_of_time:
                    log.info("time budget of %.0f s reached at step %d", cfg.time_budget, step)
                    break
                if step == self.progress.horizon:
                    log.info("%s: the schedule's horizon, step %d, reached", cfg.schedule, step)
            if stopped:
                if self.progress.step != checkpointed:
                    self.save()
                step = self.progress.step
                written = self.world.is_main and step > 0
                raise TrainingStoppedError(step, checkpoint_dir(self.run_dir, step) if written else None)
        finally:
            bar.close()
            if self._tensorboard:
                self._tensorboard.flush()
        return self.progress
