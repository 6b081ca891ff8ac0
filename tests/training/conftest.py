"""Small corpora written into a temporary directory for training tests."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "the",
    "mat",
    "and",
    "the",
    "dog",
    "ran",
    "in",
    "the",
    "park",
    "while",
    "birds",
    "sang",
]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """400 lines of random words from a 14-word vocabulary."""
    rng = random.Random(0)
    lines = (" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 15))) for _ in range(400))
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def pairs(tmp_path: Path) -> Path:
    """300 source<TAB>target lines: a word sequence and its reversal."""
    rng = random.Random(1)
    rows = []
    for _ in range(300):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 8))]
        rows.append(f"{' '.join(words)}\t{' '.join(reversed(words))}")
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path
