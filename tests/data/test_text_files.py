"""Reading user files: lines and TSV pairs, and one clear error per unusable file."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest

from attnkit.data.files import read_lines, read_pairs


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_lines_of_several_files_in_order_without_blank_lines(tmp_path: Path) -> None:
    a = write(tmp_path / "a.txt", "\ufeffFirst line\r\n\r\n  second line  \n".encode())
    b = write(tmp_path / "b.txt", b"third\n   \n\tfourth\n")
    assert read_lines([a, str(b)]) == ["First line", "second line", "third", "fourth"]
    assert read_lines([b, a]) == ["third", "fourth", "First line", "second line"]


def test_one_path_is_read_as_one_file(tmp_path: Path) -> None:
    path = write(tmp_path / "a.txt", "Ève était là\n".encode())
    assert read_lines(path) == read_lines(str(path)) == ["Ève était là"]


def test_pairs_of_a_tsv_file(tmp_path: Path) -> None:
    path = write(tmp_path / "train.tsv", "the cat\tle chat\r\n\n Ève \t Eve \n".encode())
    assert read_pairs([path]) == [("the cat", "le chat"), ("Ève", "Eve")]


@pytest.mark.parametrize(("line", "found"), [(b"no tab here", 1), (b"one\ttwo\tthree", 3)])
def test_tsv_with_wrong_columns_names_file_line_and_count(tmp_path: Path, line: bytes, found: int) -> None:
    path = write(tmp_path / "train.tsv", b"a\tb\n\n" + line + b"\n")
    expected = re.escape(f"{path}:3: expected 2 tab-separated columns") + f".* found {found};"
    with pytest.raises(ValueError, match=expected):
        read_pairs([path])


def test_tsv_with_an_empty_side_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "train.tsv", b"a\tb\n \tb\n")
    with pytest.raises(ValueError, match=re.escape(f"{path}:2: the source column is empty")):
        read_pairs([path])


def test_no_paths_is_refused() -> None:
    with pytest.raises(ValueError, match="no files given"):
        read_lines([])


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "missing.txt"
    with pytest.raises(FileNotFoundError, match=re.escape(f"{path} not found")):
        read_lines([path])


def test_directory_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path} is a directory")):
        read_pairs([tmp_path])


@pytest.mark.parametrize("content", [b"", b"\n  \n\t\r\n"])
def test_file_without_an_example_names_the_path(tmp_path: Path, content: bytes) -> None:
    good = write(tmp_path / "good.txt", b"fine\n")
    empty = write(tmp_path / "empty.txt", content)
    with pytest.raises(ValueError, match=re.escape(f"{empty} has no non-blank line")):
        read_lines([good, empty])


def test_binary_file_names_the_path_and_offset(tmp_path: Path) -> None:
    path = write(tmp_path / "model.bin", b"PK\x03\x04\nabc\x00\xff\xfe")
    with pytest.raises(ValueError, match=re.escape(f"{path} looks binary (NUL byte at line 2, byte offset 8)")):
        read_lines([path])


def test_utf16_file_is_reported_as_binary(tmp_path: Path) -> None:
    path = write(tmp_path / "utf16.txt", "hello\n".encode("utf-16"))
    with pytest.raises(ValueError, match="re-encoded as UTF-8"):
        read_lines([path])


def test_latin1_file_names_the_path_line_and_offset(tmp_path: Path) -> None:
    path = write(tmp_path / "latin1.txt", "first\nÈve était là\n".encode("latin-1"))
    with pytest.raises(ValueError, match=re.escape(f"{path}: line 2 (byte offset 6, byte 0xc8) is not valid UTF-8")):
        read_lines([path])


def test_errors_are_one_line(tmp_path: Path) -> None:
    path = write(tmp_path / "latin1.tsv", "a\tb\nè\n".encode("latin-1"))
    with pytest.raises(ValueError) as err:
        read_pairs([path])
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("content", [b"a\tb\r\nc\td\n", b"a\tb\nbad line\n", "é".encode("latin-1"), b"\x00"])
def test_files_are_never_modified(tmp_path: Path, content: bytes) -> None:
    path = write(tmp_path / "data.tsv", content)
    before = path.stat()
    with contextlib.suppress(ValueError):
        read_pairs([path])
    after = path.stat()
    assert path.read_bytes() == content
    assert (after.st_mtime_ns, after.st_size) == (before.st_mtime_ns, before.st_size)
