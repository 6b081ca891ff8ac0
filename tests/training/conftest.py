"""Small corpora written into a temporary directory for training tests."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def corpus(random_words: Callable[..., Path]) -> Path:
    """400 lines of random words."""
    return random_words(400)


@pytest.fixture
def pairs(tmp_path: Path, words: tuple[str, ...]) -> Path:
    """300 source<TAB>target lines: a word sequence and its reversal."""
    rng = random.Random(1)
    rows = []
    for _ in range(300):
        line = [rng.choice(words) for _ in range(rng.randint(3, 8))]
        rows.append(f"{' '.join(line)}\t{' '.join(reversed(line))}")
    path = tmp_path / "pairs.tsv"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path
