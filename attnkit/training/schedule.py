"""Learning-rate schedules, as functions of the step (so a resumed run needs no schedule state)."""

from __future__ import annotations

import math

from attnkit.config import TrainConfig


def noam(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """The paper's schedule: factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5).

    Linear warm-up for ``warmup`` steps, then decay with the inverse square root of the step;
    ``step`` counts from 1 (the first optimiser step).
    """
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def warmup_cosine(step: int, peak: float, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up to ``peak`` over ``warmup`` steps, then a cosine down to ``min_ratio · peak``
    at ``total`` steps (and flat after)."""
    step = max(step, 1)
    if step <= warmup:
        return peak * step / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def learning_rate(step: int, cfg: TrainConfig, d_model: int) -> float:
    """The learning rate of optimiser step ``step`` (from 1) under ``cfg``."""
    if cfg.schedule == "noam":
        return noam(step, d_model, cfg.warmup, cfg.lr)
    if cfg.schedule == "cosine":
        return warmup_cosine(step, cfg.lr, cfg.warmup, cfg.max_steps, cfg.min_lr_ratio)
    return cfg.lr
