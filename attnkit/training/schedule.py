"""Learning-rate schedules, as functions of the step (so a resumed run needs no schedule state
beyond the budget schedules' horizon, which the checkpoint's progress holds)."""

from __future__ import annotations

import math

from attnkit.config import TrainConfig

# The budget schedules measure the step rate from this fraction of the steps before the
# horizon is fixed, leaving out the first steps' allocations and warm caches.
_RATE_FROM = 0.25
MIN_HORIZON_PROBE = 20  # steps: the horizon is never fixed on fewer


def noam(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """The paper's schedule: factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5).

    Linear warm-up for ``warmup`` steps, then decay with the inverse square root of the step;
    ``step`` counts from 1 (the first optimiser step).
    """
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def warmup_decay(step: int, peak: float, warmup: int, total: int, min_ratio: float, shape: str = "cosine") -> float:
    """Linear warm-up to ``peak`` over ``warmup`` steps, then a cosine (or, with ``shape="linear"``,
    a straight line) down to ``min_ratio · peak`` at ``total`` steps (and flat after)."""
    step = max(step, 1)
    if step <= warmup:
        return peak * step / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    fall = 0.5 * (1 + math.cos(math.pi * progress)) if shape == "cosine" else 1.0 - progress
    return peak * (min_ratio + (1 - min_ratio) * fall)


def warmup_cosine(step: int, peak: float, warmup: int, total: int, min_ratio: float) -> float:
    """:func:`warmup_decay` with a cosine."""
    return warmup_decay(step, peak, warmup, total, min_ratio, "cosine")


def horizon_probe(cfg: TrainConfig) -> int:
    """The step after which a budget schedule fixes its horizon: the end of the warm-up, and
    at least :data:`MIN_HORIZON_PROBE` steps (the rate of fewer is noise)."""
    return max(cfg.warmup, MIN_HORIZON_PROBE)


def budget_horizon(cfg: TrainConfig, seconds: dict[int, float]) -> int:
    """The horizon in steps of a budget schedule: where the time budget would end at the rate
    measured so far. ``seconds`` maps steps to training seconds at their end, and holds
    :func:`horizon_probe` and the step ``_RATE_FROM`` of the way to it (or the earliest step
    after). The horizon is at least the probe step + 1 and at most ``train.max_steps``."""
    if cfg.time_budget is None:
        raise ValueError(f"train.schedule={cfg.schedule} needs train.time_budget")
    probe = horizon_probe(cfg)
    first = min(s for s in seconds if s >= int(_RATE_FROM * probe))
    # One measured step (a run resumed just before the probe): its time includes the start.
    per_step = (seconds[probe] - seconds[first]) / (probe - first) if first < probe else seconds[probe] / probe
    left = max(cfg.time_budget - seconds[probe], 0.0)
    steps = probe + (int(left / per_step) if per_step > 0 else cfg.max_steps)
    return max(probe + 1, min(steps, cfg.max_steps))


def learning_rate(step: int, cfg: TrainConfig, d_model: int, horizon: int | None = None) -> float:
    """The learning rate of optimiser step ``step`` (from 1) under ``cfg``. The budget
    schedules decay towards ``horizon``; until it is fixed, towards ``train.max_steps`` (which
    only the warm-up's steps see, and the steps of a run too short to fix a horizon)."""
    if cfg.schedule == "noam":
        return noam(step, d_model, cfg.warmup, cfg.lr)
    if cfg.schedule == "cosine":
        return warmup_cosine(step, cfg.lr, cfg.warmup, cfg.max_steps, cfg.min_lr_ratio)
    if cfg.schedule.startswith("budget-"):
        total = cfg.max_steps if horizon is None else horizon
        return warmup_decay(step, cfg.lr, cfg.warmup, total, cfg.min_lr_ratio, cfg.schedule.removeprefix("budget-"))
    if cfg.schedule == "warmup-constant":
        return cfg.lr * min(1.0, max(step, 1) / max(cfg.warmup, 1))
    return cfg.lr
