"""Rewrite the *code* and *figure* columns of docs/chapter.md from the sources.

*code* lists the files whose docstrings cite each label; *figure* lists the experiments of
``attnkit figures`` whose ``LABELS`` show it (their figures and numbers are in
docs/chapter/REPORT.md). Run after adding or moving a chapter tag or an experiment:
``python tools/chapter_map.py``. The *test* column is written by hand;
tests/test_chapter_labels.py checks the result.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_chapter_labels import cited_tags, experiments_showing  # noqa: E402

ROW = re.compile(r"\| `([a-z]+:[a-z0-9-]+)` \| ([^|]*) \| ([^|]*) \| ([^|]*) \|(?: ([^|]*) \|)?$")


def main() -> None:
    cited, shown = cited_tags(), experiments_showing()
    path = ROOT / "docs" / "chapter.md"
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        match = ROW.match(line)
        if match:
            label, what, _, test, _ = match.groups()
            code = ", ".join(sorted(cited[label])) if label in cited else "—"
            figure = ", ".join(shown[label]) if label in shown else "—"
            line = f"| `{label}` | {what} | {code} | {test.strip()} | {figure} |"
        lines.append(line)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
