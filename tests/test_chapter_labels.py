"""Every chapter tag cited in the package is a real label, and docs/chapter.md says truly
which labels have a home in the code."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from attnkit.chapter.figures import EXPERIMENTS
from attnkit.chapter.labels import ITEMS, LABELS

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT.parent / "shared" / "seed" / "06-attention.tex"
TAG = re.compile(r"\[((?:eq|alg|fig|tab|prop|def):[a-z0-9-]+)\]")


def cited_tags() -> dict[str, set[str]]:
    """label -> files of the package that cite it."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / "attnkit").rglob("*.py"):
        if path.name == "labels.py":  # the table of labels itself
            continue
        for label in TAG.findall(path.read_text(encoding="utf-8")):
            found.setdefault(label, set()).add(str(path.relative_to(ROOT)))
    return found


def experiments_showing() -> dict[str, list[str]]:
    """label -> the ``attnkit figures`` experiments whose LABELS show it, in report order."""
    shown: dict[str, list[str]] = {}
    for name in EXPERIMENTS:
        for label in importlib.import_module(f"attnkit.chapter.{name}").LABELS:
            shown.setdefault(label, []).append(name)
    return shown


def documented(column: int) -> dict[str, str]:
    """label -> one column of docs/chapter.md's table (2: code, 4: figure; '—' where none)."""
    rows = {}
    for line in (ROOT / "docs" / "chapter.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`") and ":" in cells[0]:
            rows[cells[0].strip("`")] = cells[column]
    return rows


def test_every_cited_tag_is_a_chapter_label() -> None:
    unknown = {label: files for label, files in cited_tags().items() if label not in ITEMS}
    assert not unknown, f"tags the chapter does not define: {unknown}"


def test_label_table_matches_the_chapter_source() -> None:
    if not CHAPTER.exists():
        pytest.skip(f"chapter source not at {CHAPTER}")
    in_source = set(re.findall(r"\\label\{([^}]*)\}", CHAPTER.read_text(encoding="utf-8")))
    assert in_source == set(LABELS)


def test_docs_map_lists_every_label_once() -> None:
    assert set(documented(2)) == set(ITEMS)


def test_docs_map_says_truly_which_labels_have_a_home() -> None:
    cited = cited_tags()
    for label, code in documented(2).items():
        if label in cited:
            for path in cited[label]:
                assert path in code, f"{label} is cited in {path}, but docs/chapter.md says {code!r}"
        else:
            assert code == "—", f"{label} has no tag in the code, but docs/chapter.md says {code!r}"


def test_every_experiment_shows_real_labels() -> None:
    unknown = {label: names for label, names in experiments_showing().items() if label not in LABELS}
    assert not unknown, f"experiments cite labels the chapter does not define: {unknown}"


def test_docs_map_names_the_figures_of_every_label() -> None:
    shown = experiments_showing()
    for label, figure in documented(4).items():
        assert figure == ", ".join(shown.get(label, ["—"])), f"{label}: run python tools/chapter_map.py"
    missing = sorted(set(ITEMS) - set(shown))
    assert not missing, f"labels no experiment of attnkit figures shows: {missing}"
