"""The README and the guide name their evidence: every results file a page names exists in
benchmarks/results/, every guide page opens with where it stands, and the README stays a front
door (at most 200 lines). A figure whose file was renamed or never committed fails here."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
# The guide's pages (REPORT.md is written whole by `attnkit figures`, with its own header).
GUIDE = sorted(p for p in (ROOT / "docs").glob("*.md"))

PATH = re.compile(r"benchmarks/results/([\w.*{},-]+)")
CODE = re.compile(r"`([\w.*{},-]+\.(?:json|md|png|\*))`")
PLACEHOLDER = re.compile(r"[A-Z]{3,}")  # fewlabels-FAMILY-TASK.json names a kind of file


def expand(pattern: str) -> list[str]:
    """``a-{x,y}-b.json`` -> the names it abbreviates (``*`` stays a glob)."""
    parts = re.split(r"\{([^}]*)\}", pattern)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def named(text: str) -> set[str]:
    """The results files a page names: as a path under benchmarks/results/, or in code as a bare
    name that starts like one of the committed results (``decoding-…``, ``fewlabels-…``)."""
    prefixes = {p.name.split("-")[0].split(".")[0] for p in RESULTS.iterdir()}
    names = {m.rstrip(".,") for m in PATH.findall(text)}
    names |= {m for m in CODE.findall(text) if m.split("-")[0].split(".")[0] in prefixes and "/" not in m}
    return {n for n in names if n and not n.endswith("/") and not PLACEHOLDER.search(n)}


def missing(text: str) -> list[str]:
    """The names of ``text``'s results files (globs and braces expanded) that match no file."""
    return [one for name in sorted(named(text)) for one in expand(name) if not any(RESULTS.glob(one))]


def test_the_check_sees_paths_braces_globs_and_bare_names() -> None:
    assert expand("decoding-marian-{native,avx2-forced}-x.json") == [
        "decoding-marian-native-x.json",
        "decoding-marian-avx2-forced-x.json",
    ]
    text = "see `benchmarks/results/grammars.json`, `fewlabels-nothing.json`, `config.json` and `recipe-t5-batch.*`"
    assert named(text) == {"grammars.json", "fewlabels-nothing.json", "recipe-t5-batch.*"}
    assert missing(text) == ["fewlabels-nothing.json"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_results_file_a_page_names_exists(page: Path) -> None:
    absent = missing(page.read_text(encoding="utf-8"))
    assert not absent, f"{page.relative_to(ROOT)} names results files that are not in benchmarks/results/: {absent}"


@pytest.mark.parametrize("page", GUIDE, ids=lambda p: p.name)
def test_every_guide_page_opens_with_where_it_stands(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    first_section = text.find("\n## ")
    assert "**Where we stand**" in text[: first_section if first_section > 0 else len(text)], (
        f"docs/{page.name} does not open with its 'Where we stand' table (figure, CPU class, date, results file)"
    )


def test_the_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; measurements belong in docs/"
