"""A recipe that fits the machine: a preset with a wall-clock budget measures the step time of
each model its recipe study screened, on this machine, before training, and trains the one the
study found best for the number of updates its budget allows here.

The study (``python -m benchmarks recipe --screen fit-NAME``, docs/translation.md) trains each
candidate of a preset for several numbers of updates and scores it; :data:`FIT_TABLES` holds
those scores. The choice is a pure function of the table, the measured seconds per step and the
budget (:func:`choose`): each candidate's updates in the budget, its score there interpolated
from the study (in log updates; held flat past the study's last budget), and the best of those
the study trained for that few updates wins.
The choice, the measured step times and the CPU class are saved in ``run.json`` (its
``machine`` record) and kept by a resumed run; explicit options win over it (:func:`fit_for`).
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Candidate:
    """One model (and its schedule) of a fit table: the options that make it, and its study
    score after each number of updates the study trained it for."""

    name: str
    changes: dict[str, str]  # --section.key=value options over the preset, as the study ran them
    scores: dict[int, float]  # updates -> the study's score (held-out BLEU, the better of greedy and beam-4)

    def score(self, updates: float) -> float:
        """The score after ``updates``, interpolated linearly in log(updates) between the study's
        budgets, held flat past its last; below its first, the first (an optimistic guess:
        :func:`choose` never picks a candidate there)."""
        budgets = sorted(self.scores)
        if updates <= budgets[0]:
            return self.scores[budgets[0]]
        if updates >= budgets[-1]:
            return self.scores[budgets[-1]]
        i = bisect.bisect_right(budgets, updates)
        lo, hi = budgets[i - 1], budgets[i]
        t = (math.log(updates) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return self.scores[lo] + t * (self.scores[hi] - self.scores[lo])


@dataclass(frozen=True)
class FitTable:
    """The candidates of one preset, smallest model first, and the study that scored them."""

    preset: str
    study: str  # the results file of benchmarks/results the scores come from
    candidates: tuple[Candidate, ...]

    @property
    def min_updates(self) -> int:
        """The fewest updates the study trained for: a budget that affords fewer is refused."""
        return min(min(c.scores) for c in self.candidates)

    @property
    def keys(self) -> frozenset[str]:
        """Every option some candidate sets."""
        return frozenset(k for c in self.candidates for k in c.changes)


@dataclass(frozen=True)
class FitChoice:
    """What :func:`choose` picked and why; saved in run.json's machine record."""

    preset: str
    budget: float  # seconds of training
    step_seconds: dict[str, float]  # candidate -> measured seconds per step here
    updates: dict[str, int]  # candidate -> updates the budget affords at that rate
    predicted: dict[str, float]  # candidate -> the study's score at those updates
    chosen: str
    changes: dict[str, str]
    study: str
    probe_seconds: float = 0.0  # the measurement's own time, outside the training budget

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """One line: what was chosen, for how many updates, against what."""
        others = ", ".join(
            f"{name} {self.updates[name]:,} updates (study {self.predicted[name]:.1f})"
            for name in self.updates
            if name != self.chosen
        )
        return (
            f"machine fit: {self.chosen}: {self.updates[self.chosen]:,} updates in {self.budget:.0f} s at "
            f"{self.step_seconds[self.chosen]:.3f} s a step here (study BLEU {self.predicted[self.chosen]:.1f}); "
            f"against {others} (measured in {self.probe_seconds:.0f} s; table: {self.study})"
        )


def choose(table: FitTable, step_seconds: dict[str, float], budget: float, max_steps: int | None = None) -> FitChoice:
    """The candidate of ``table`` with the best study score at the updates ``budget`` seconds
    afford at each one's ``step_seconds`` (and ``max_steps`` allows); ties go to the larger
    model. A candidate that would make fewer updates than its study's first screen is not
    chosen (its score there is unknown); when none would make enough, the run is refused."""
    missing = [c.name for c in table.candidates if c.name not in step_seconds]
    if missing:
        raise ValueError(f"no measured step time for {', '.join(missing)}")
    if max_steps is not None and max_steps < table.min_updates:
        raise ValueError(
            f"train.max_steps={max_steps:,} is fewer than the {table.min_updates:,} updates {table.preset}'s "
            f"machine-fit study starts at; give --train.max_steps={table.min_updates} or more, or size the model "
            "yourself with --train.fit=false"
        )
    cap = max_steps if max_steps is not None else math.inf
    updates = {c.name: int(min(budget / step_seconds[c.name], cap)) for c in table.candidates}
    eligible = [c for c in table.candidates if updates[c.name] >= min(c.scores)]
    if not eligible:
        fastest = max(table.candidates, key=lambda c: updates[c.name])
        need = math.ceil(min(fastest.scores) * step_seconds[fastest.name])
        raise ValueError(
            f"train.time_budget={budget:g} s affords {updates[fastest.name]:,} updates of the fastest model of "
            f"{table.preset}'s machine-fit table ({fastest.name}, {step_seconds[fastest.name]:.3f} s a step here), "
            f"fewer than the {min(fastest.scores):,} its study starts at; give --train.time_budget={need} or more, "
            "or size the model yourself with --train.fit=false"
        )
    predicted = {c.name: c.score(updates[c.name]) for c in table.candidates}
    order = {c.name: i for i, c in enumerate(table.candidates)}
    best = max(eligible, key=lambda c: (round(predicted[c.name], 6), order[c.name]))
    return FitChoice(
        table.preset, budget, dict(step_seconds), updates, predicted, best.name, dict(best.changes), table.study
    )


def fit_for(
    preset: str | None, overrides: Iterable[str], fit: bool, time_budget: float | None
) -> tuple[FitTable | None, str]:
    """The table a run of ``preset`` with these explicit ``overrides`` (option keys) is fitted
    with, or None, and why, in a few words. Any explicit ``model.*`` option, or one a candidate
    sets, turns the fit off: the study scored its candidates' models only, and what the user
    asks for is trained as asked (a ``train.*`` option is kept either way)."""
    table = FIT_TABLES.get(preset or "")
    if table is None:
        return None, ""
    if not fit:
        return None, "train.fit=false"
    if time_budget is None:
        return None, "no time budget to fit"
    explicit = sorted(k for k in set(overrides) if k in table.keys or k.startswith("model."))
    if explicit:
        return None, f"explicit {', '.join('--' + k for k in explicit)} (explicit options win)"
    return table, ""


def measure(
    candidates: Sequence[Candidate],
    step: Callable[[Candidate], Callable[[], float]],
    steps: int = 5,
    warm: int = 2,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Seconds per typical training step of each candidate: ``step(candidate)`` builds it and
    returns a function that runs one step and returns its size relative to a typical step (its
    padded positions over the epoch's mean); ``warm`` steps are left out (they allocate and
    fill caches), then ``steps`` are timed on ``clock``."""
    seconds = {}
    for candidate in candidates:
        run_step = step(candidate)
        for _ in range(warm):
            run_step()
        start = clock()
        size = sum(run_step() for _ in range(steps))
        seconds[candidate.name] = (clock() - start) / size
    return seconds


# The tables of the presets with a wall-clock budget: each candidate's held-out validation BLEU
# (the better of greedy and beam-4, all 684 validation verses, seed 0) after each number of
# updates, from the study named (docs/translation.md, "A recipe that fits the machine"; run by
# steps in bf16 on an AVX512-BF16 CPU, 2026-12-02). Smallest model first.
_SHORT_FIRST = {"data.curriculum_max_tokens": "32"}  # a first epoch of the verses of <= 32 positions
FIT_TABLES: dict[str, FitTable] = {
    "translate-en-fr": FitTable(
        "translate-en-fr",
        "recipe-fit-translate-en-fr.json",
        (
            Candidate(
                "d_model 128, short verses first",
                {"model.d_model": "128", "model.n_heads": "2", "model.d_ff": "512", **_SHORT_FIRST},
                {500: 2.74, 1000: 7.03, 2000: 10.74, 4000: 15.29},
            ),
            Candidate(
                "d_model 192, short verses first",
                {"model.d_model": "192", "model.n_heads": "3", "model.d_ff": "768", **_SHORT_FIRST},
                {500: 2.54, 1000: 7.29, 2000: 10.55, 4000: 16.52},
            ),
            Candidate("d_model 256 (the preset)", {}, {500: 2.01, 1000: 4.96, 2000: 11.24, 4000: 15.07}),
        ),
    ),
}


@dataclass(frozen=True)
class MachineRecord:
    """What a run chose for the machine it started on: saved as run.json's ``machine``, kept
    by a resumed run (on this machine or another)."""

    cpu_class: str  # the class acted on (attnkit.machine.cpu_class)
    cpu_detected: str  # the CPU's own class
    forced_by: str | None  # ATTNKIT_CPU_CLASS or train.cpu_class, when the two differ
    precision: str  # fp32 / bf16 / fp16: what autocast runs
    reason: str  # why that precision, in words
    fit: dict[str, Any] | None = None  # FitChoice.to_dict(), or None
    no_fit: str = ""  # why the run was not fitted, where it has a table but was not

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> list[str]:
        """The lines a run prints at its start."""
        lines = [f"machine: {self.reason}"]
        if self.fit is not None:
            lines.append(FitChoice(**self.fit).describe())
        elif self.no_fit:
            lines.append(f"machine fit: off: {self.no_fit}")
        return lines
