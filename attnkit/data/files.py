"""Reading the user's text files: one example per line, ``source<TAB>target`` pairs, or
``text<TAB>label`` examples, streamed line by line (a file of any size is never held whole).

Files must be UTF-8 (a leading byte-order mark is dropped); ``\\n`` and ``\\r\\n`` both end a
line; lines holding only whitespace are skipped, and surrounding whitespace is removed from
each line (each column, for pairs). Anything else (a missing path, a directory, a binary or
non-UTF-8 file, a file with no example) is a one-line error naming the path, the line and the
fix. Files are only ever read.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

Kind = Literal["lines", "pairs", "labeled"]  # what one line of a file holds: text, source<TAB>target, text<TAB>label
SNIFF_BYTES = 1 << 16  # a NUL byte in a file's first 64 KiB: binary, whatever its later lines


def read_lines(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """The non-blank lines of plain-text files, file after file in the given order."""
    return list(iter_examples("lines", paths))


def read_pairs(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[tuple[str, str]]:
    """``(source, target)`` from files of ``source<TAB>target`` lines, file after file."""
    return list(iter_examples("pairs", paths))


def read_labeled(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[tuple[str, str]]:
    """``(text, label)`` from files of ``text<TAB>label`` lines, file after file."""
    return list(iter_examples("labeled", paths))


def iter_examples(kind: Kind, paths: str | os.PathLike | Sequence[str | os.PathLike]) -> Iterator[Any]:
    """The examples of ``paths`` one at a time, as :func:`read_lines`, :func:`read_pairs` or
    :func:`read_labeled` return them (``kind``: lines, pairs or labeled)."""
    parse = PARSERS[kind]
    for path in as_paths(paths):
        for lineno, line in numbered_lines(path):
            yield parse(path, lineno, line)


def parse_line(path: Path, lineno: int, line: str) -> str:
    return line.strip()


def parse_pair(path: Path, lineno: int, line: str) -> tuple[str, str]:
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
    return source, target


def parse_labeled(path: Path, lineno: int, line: str) -> tuple[str, str]:
    text, tab, label = line.rpartition("\t")
    text, label = text.strip(), label.strip()
    if not tab:
        raise ValueError(f"{path}:{lineno}: no label: write text<TAB>label (found no tab)")
    if not text or not label:
        side = "text" if not text else "label"
        raise ValueError(f"{path}:{lineno}: the {side} is empty; remove the line or fill it in")
    return text, label


PARSERS: dict[Kind, Callable[[Path, int, str], Any]] = {
    "lines": parse_line,
    "pairs": parse_pair,
    "labeled": parse_labeled,
}


def as_paths(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """One path, or several, as a non-empty list of ``Path``."""
    if isinstance(paths, (str, os.PathLike)):
        return [Path(paths)]
    if not paths:
        raise ValueError("no files given; pass at least one path")
    return [Path(p) for p in paths]


def numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number from 1, line)`` for each non-blank line of ``path``, line endings removed,
    read a line at a time."""
    found = False
    with open_text(path) as file:
        offset = 0
        for lineno, raw in enumerate(file, start=1):
            nul = raw.find(b"\0")
            if nul >= 0:
                raise binary(path, lineno, offset + nul)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                at = offset + err.start
                raise ValueError(
                    f"{path}: line {lineno} (byte offset {at}, byte 0x{raw[err.start]:02x}) is not valid UTF-8; "
                    f"re-encode the file as UTF-8, e.g. iconv -f latin1 -t utf-8 {path} > {path}.utf8"
                ) from None
            if lineno == 1:
                line = line.removeprefix("\ufeff")
            offset += len(raw)
            line = line.removesuffix("\n").removesuffix("\r")
            if line.strip():
                found = True
                yield lineno, line
    if not found:
        raise ValueError(f"{path} has no non-blank line; pass a file with one example per line")


def open_text(path: Path):
    """``path`` opened for reading as bytes, after checking it is a file and not binary (a
    NUL byte in its first :data:`SNIFF_BYTES`)."""
    if path.is_dir():
        raise ValueError(f"{path} is a directory; pass the text files inside it")
    try:
        file = path.open("rb")
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} not found; check the path (relative paths start at {Path.cwd()})") from None
    head = file.read(SNIFF_BYTES)
    nul = head.find(b"\0")
    if nul >= 0:
        file.close()
        raise binary(path, head.count(b"\n", 0, nul) + 1, nul)
    file.seek(0)
    return file


def binary(path: Path, lineno: int, offset: int) -> ValueError:
    return ValueError(
        f"{path} looks binary (NUL byte at line {lineno}, byte offset {offset}); pass a UTF-8 "
        "text file (UTF-16 text must first be re-encoded as UTF-8)"
    )
