"""Learning-rate schedules against their formulas."""

from __future__ import annotations

import math

import pytest

from attnkit.config import TrainConfig
from attnkit.training.schedule import (
    MIN_HORIZON_PROBE,
    budget_horizon,
    horizon_probe,
    learning_rate,
    noam,
    warmup_cosine,
)


@pytest.mark.parametrize("step", [1, 2, 100, 3999, 4000, 4001, 10_000, 100_000])
def test_noam_equals_the_papers_formula(step: int) -> None:
    # Vaswani et al. 2017, eq. (3): lrate = d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5)
    d_model, warmup = 512, 4000
    expected = d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
    assert noam(step, d_model, warmup) == pytest.approx(expected, rel=1e-12)
    assert noam(step, d_model, warmup, factor=2.0) == pytest.approx(2 * expected, rel=1e-12)


def test_noam_peaks_at_the_end_of_warmup() -> None:
    rates = [noam(s, 512, 4000) for s in range(1, 20_000)]
    assert max(range(len(rates)), key=rates.__getitem__) + 1 == 4000
    assert rates[3999] == pytest.approx(512**-0.5 * 4000**-0.5)


def test_warmup_cosine_shape() -> None:
    peak, warmup, total, floor = 1e-3, 100, 1000, 0.1
    assert warmup_cosine(50, peak, warmup, total, floor) == pytest.approx(peak * 0.5)
    assert warmup_cosine(100, peak, warmup, total, floor) == pytest.approx(peak)
    mid = warmup + (total - warmup) // 2
    assert warmup_cosine(mid, peak, warmup, total, floor) == pytest.approx(peak * (floor + (1 - floor) * 0.5))
    assert warmup_cosine(total, peak, warmup, total, floor) == pytest.approx(peak * floor)
    assert warmup_cosine(5 * total, peak, warmup, total, floor) == pytest.approx(peak * floor)


def test_learning_rate_follows_the_config() -> None:
    assert learning_rate(10, TrainConfig(schedule="noam", lr=2.0, warmup=40), 64) == pytest.approx(
        2.0 * 64**-0.5 * 10 * 40**-1.5
    )
    assert learning_rate(10, TrainConfig(schedule="constant", lr=3e-4), 64) == 3e-4
    warm = TrainConfig(schedule="warmup-constant", lr=3e-4, warmup=40)  # no time budget needed
    assert [learning_rate(s, warm, 64) for s in (0, 10, 40, 41, 10**6)] == pytest.approx([7.5e-6, 7.5e-5, *[3e-4] * 3])
    assert learning_rate(1, TrainConfig(schedule="warmup-constant", lr=3e-4, warmup=0), 64) == 3e-4
    cfg = TrainConfig(schedule="cosine", lr=1e-3, warmup=0, max_steps=100, min_lr_ratio=0.0)
    assert learning_rate(100, cfg, 64) == pytest.approx(0.0, abs=1e-15)
    assert learning_rate(50, cfg, 64) == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 0.5)))


def budget(schedule: str = "budget-linear", **changes: object) -> TrainConfig:
    settings = dict(schedule=schedule, lr=1e-3, warmup=40, time_budget=100.0, max_steps=10_000, min_lr_ratio=0.0)
    return TrainConfig(**{**settings, **changes})


def test_budget_horizon_is_where_the_budget_ends_at_the_measured_rate() -> None:
    cfg = budget()
    assert horizon_probe(cfg) == 40
    uniform = {s: 0.5 + 1.0 * s for s in range(1, 41)}  # a slow first step, then 1 s a step
    assert budget_horizon(cfg, uniform) == 40 + int((100.0 - 40.5) / 1.0)
    assert budget_horizon(budget(max_steps=60), uniform) == 60  # max_steps still binds
    assert budget_horizon(budget(time_budget=10.0), uniform) == 41  # the budget is spent: the decay ends next step
    assert horizon_probe(budget(warmup=5)) == MIN_HORIZON_PROBE


@pytest.mark.parametrize("schedule", ["budget-linear", "budget-cosine"])
def test_budget_schedules_at_start_warmup_edge_and_end(schedule: str) -> None:
    cfg, horizon = budget(schedule), 1000
    assert learning_rate(1, cfg, 64, horizon) == pytest.approx(1e-3 / 40)
    assert learning_rate(1, cfg, 64, None) == pytest.approx(1e-3 / 40)  # before the horizon is fixed: the warm-up
    assert learning_rate(40, cfg, 64, horizon) == pytest.approx(1e-3)
    assert learning_rate(horizon, cfg, 64, horizon) == pytest.approx(0.0, abs=1e-15)
    middle = learning_rate(520, cfg, 64, horizon)
    assert middle == pytest.approx(0.5e-3)  # halfway down, for the line and the cosine alike
    quarter = learning_rate(280, cfg, 64, horizon)
    cosine = 1e-3 * 0.5 * (1 + math.cos(math.pi / 4))
    assert quarter == pytest.approx(0.75e-3 if schedule == "budget-linear" else cosine)
    floor = budget(schedule, min_lr_ratio=0.1)
    assert learning_rate(horizon, floor, 64, horizon) == pytest.approx(1e-4)
    provisional = budget(schedule, warmup=0, max_steps=120)  # until the horizon is fixed: max_steps
    assert learning_rate(60, provisional, 64, None) == pytest.approx(0.5e-3)


def test_budget_schedule_needs_a_time_budget() -> None:
    with pytest.raises(ValueError, match=r"train.schedule=budget-cosine .* train.time_budget is null; set"):
        TrainConfig(schedule="budget-cosine", time_budget=None)
