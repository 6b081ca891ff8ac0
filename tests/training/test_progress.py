"""Progress output: a redrawn bar on a terminal; anywhere else one plain line per interval and
one at the end, with the same fields, and never a carriage return."""

from __future__ import annotations

import io

import pytest

from attnkit import progress as progress_module
from attnkit.progress import ProgressReport


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    """A perf_counter that advances ``tick`` seconds per call."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 0.0, tick

    def perf_counter(self) -> float:
        self.now += self.tick
        return self.now


def drive(report: ProgressReport, steps: int) -> None:
    for step in range(1, steps + 1):
        report.set_fields(step=step, loss=f"{1 / step:.3f}")
        report.update(step)
    report.close()


def test_a_log_gets_a_plain_line_per_interval_and_one_at_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_module, "time", Clock(tick=1.0))  # each update: 1 s of the clock
    log = io.StringIO()
    drive(ProgressReport(100, "training", every=30.0, stream=log), 100)
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert 3 <= len(lines) <= 5  # ~100 s of clock in 30-s intervals, then the final line
    assert lines[-1].startswith("training: 100/100 steps (100%), step 100, loss 0.010 [")
    assert all(line.startswith("training: ") for line in lines)


def test_seconds_as_the_unit_and_quiet_means_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_module, "time", Clock(tick=1.0))
    log = io.StringIO()
    report = ProgressReport(600, "training", unit="s", every=1e9, stream=log)
    report.update(150.4)
    report.close()
    assert log.getvalue().startswith("training: 150/600 s (25%) [")
    quiet = io.StringIO()
    drive(ProgressReport(10, "training", enabled=False, every=1e-9, stream=quiet), 10)
    assert quiet.getvalue() == ""


def test_a_terminal_gets_the_redrawn_bar() -> None:
    terminal = Terminal()
    drive(ProgressReport(50, "training", stream=terminal), 50)
    assert "\r" in terminal.getvalue() and "50/50" in terminal.getvalue()


def test_a_bad_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="progress interval must be > 0 seconds, got 0"):
        ProgressReport(10, "training", every=0, stream=io.StringIO())


def test_bytes_are_shown_in_mb_with_the_rate_and_the_time_left(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(tick=2.0)  # perf_counter: 2 s at the start, 4 s at the line
    monkeypatch.setattr(progress_module, "time", clock)
    log = io.StringIO()
    report = ProgressReport(100e6, "tokenizing", unit="B", every=1e9, stream=log)
    report.update(25e6)
    assert report.line().startswith("tokenizing: 25.0/100.0 MB (25%), 6.2 MB/s, 12 s left [")
    report.update(100e6)
    report.close()
    assert "s left" not in log.getvalue().splitlines()[-1]  # done: nothing left
