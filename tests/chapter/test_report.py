"""``attnkit figures --quick`` writes every experiment's section, figures and numbers, with
the machine and the seed; refuses to overwrite a user's directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from attnkit.chapter.figures import EXPERIMENTS, REPORT
from attnkit.cli import main


def test_quick_report_covers_every_experiment_and_states_machine_and_seed(out: Path, report: dict) -> None:
    assert list(report["sections"]) == list(EXPERIMENTS)
    assert report["quick"] is True and report["seed"] == 0 and report["machine"]["torch"] == torch.__version__
    text = (out / REPORT).read_text(encoding="utf-8")
    for s in report["sections"].values():
        assert f"## {s['title']}" in text
        for figure in s["figures"]:
            assert f"]({figure})" in text and (out / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_figures_refuse_a_directory_of_user_files(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["figures", "--quick", "--only", "flow", "--out", str(tmp_path)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_only_updates_one_section_of_an_earlier_report(out: Path, tmp_path: Path) -> None:
    copy = tmp_path / "report"
    shutil.copytree(out, copy)
    before = json.loads((copy / "report.json").read_text())
    assert main(["figures", "--quick", "--only", "flow", "--out", str(copy)]) == 0
    after = json.loads((copy / "report.json").read_text())
    assert list(after["sections"]) == list(EXPERIMENTS)  # the others kept, in the chapter's order
    assert after["sections"]["flow"]["seconds"] != before["sections"]["flow"]["seconds"]
    assert after["sections"]["heads"] == before["sections"]["heads"]


def test_only_refuses_a_report_of_the_other_mode(out: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    copy = tmp_path / "report"
    shutil.copytree(out, copy)
    assert main(["figures", "--only", "flow", "--out", str(copy)]) == 2
    assert "--quick mode, seed 0" in capsys.readouterr().err
