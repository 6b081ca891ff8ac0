"""Rewrite the *code* column of docs/chapter.md from the tags cited in attnkit's sources.

Run after adding or moving a chapter tag: ``python tools/chapter_map.py``. The *test* column
is written by hand; tests/test_chapter_labels.py checks the result.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_chapter_labels import cited_tags  # noqa: E402

ROW = re.compile(r"\| `([a-z]+:[a-z0-9-]+)` \| ([^|]*) \| ([^|]*) \| (.*)$")


def main() -> None:
    cited = cited_tags()
    path = ROOT / "docs" / "chapter.md"
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        match = ROW.match(line)
        if match:
            label, what, _, rest = match.groups()
            code = ", ".join(sorted(cited[label])) if label in cited else "—"
            line = f"| `{label}` | {what} | {code} | {rest}"
        lines.append(line)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
