"""The benchmark suites run (tiny shapes, one repeat): their numbers are reports, never asserted
here, but the code that produces them — the GPU script's included, on the CPU — must work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("suite", "options"),
    [("peak", []), ("attention", ["--small"]), ("gpu", ["--small", "--device", "cpu"])],
)
def test_suite_runs_and_writes_json(suite: str, options: list[str], tmp_path: Path) -> None:
    out = tmp_path / f"{suite}.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks", suite, *options, "--repeats", "1", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.lstrip().startswith("###")
    numbers = json.loads(out.read_text())
    assert numbers["machine"]["torch"]
