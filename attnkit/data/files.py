"""Reading the user's text files: one example per line, or source<TAB>target pairs.

Files must be UTF-8 (a leading byte-order mark is dropped); ``\\n`` and ``\\r\\n`` both end a
line; lines holding only whitespace are skipped, and surrounding whitespace is removed from
each line (each column, for pairs). Anything else (a missing path, a directory, a binary or
non-UTF-8 file, a file with no example) is a one-line error naming the path and the fix.
Files are only ever read.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def read_lines(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """The non-blank lines of plain-text files, file after file in the given order."""
    return [line.strip() for path in as_paths(paths) for _, line in numbered_lines(path)]


def read_pairs(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[tuple[str, str]]:
    """``(source, target)`` from files of ``source<TAB>target`` lines, file after file."""
    pairs = []
    for path in as_paths(paths):
        for lineno, line in numbered_lines(path):
            columns = line.split("\t")
            if len(columns) != 2:
                raise ValueError(
                    f"{path}:{lineno}: expected 2 tab-separated columns (source<TAB>target), found {len(columns)}; "
                    "a tab inside a sentence must be replaced by a space"
                )
            source, target = (column.strip() for column in columns)
            if not source or not target:
                side = "source" if not source else "target"
                raise ValueError(f"{path}:{lineno}: the {side} column is empty; remove the line or fill it in")
            pairs.append((source, target))
    return pairs


def read_labeled(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[tuple[str, str]]:
    """``(text, label)`` from files of ``text<TAB>label`` lines, file after file."""
    examples = []
    for path in as_paths(paths):
        for lineno, line in numbered_lines(path):
            text, tab, label = line.rpartition("\t")
            text, label = text.strip(), label.strip()
            if not tab:
                raise ValueError(f"{path}:{lineno}: no label: write text<TAB>label (found no tab)")
            if not text or not label:
                side = "text" if not text else "label"
                raise ValueError(f"{path}:{lineno}: the {side} is empty; remove the line or fill it in")
            examples.append((text, label))
    return examples


def as_paths(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """One path, or several, as a non-empty list of ``Path``."""
    if isinstance(paths, (str, os.PathLike)):
        return [Path(paths)]
    if not paths:
        raise ValueError("no files given; pass at least one path")
    return [Path(p) for p in paths]


def numbered_lines(path: Path) -> list[tuple[int, str]]:
    """``(line number from 1, line)`` for each non-blank line of ``path``, line endings removed."""
    lines = [
        (lineno, line.removesuffix("\r"))
        for lineno, line in enumerate(read_text(path).split("\n"), start=1)
        if line.strip()
    ]
    if not lines:
        raise ValueError(f"{path} has no non-blank line; pass a file with one example per line")
    return lines


def read_text(path: Path) -> str:
    """The whole of ``path`` decoded as UTF-8, after checking it is a text file."""
    if path.is_dir():
        raise ValueError(f"{path} is a directory; pass the text files inside it")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} not found; check the path (relative paths start at {Path.cwd()})") from None
    nul = data.find(b"\0")
    if nul >= 0:
        raise ValueError(
            f"{path} looks binary (NUL byte at line {line_of(data, nul)}, byte offset {nul}); pass a UTF-8 "
            "text file (UTF-16 text must first be re-encoded as UTF-8)"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{path}: line {line_of(data, err.start)} (byte offset {err.start}, byte 0x{data[err.start]:02x}) is not "
            f"valid UTF-8; re-encode the file as UTF-8, e.g. iconv -f latin1 -t utf-8 {path} > {path}.utf8"
        ) from None
    return text.removeprefix("\ufeff")


def line_of(data: bytes, offset: int) -> int:
    """The 1-based line number of byte ``offset``."""
    return data.count(b"\n", 0, offset) + 1
