"""Writing that survives a crash: a directory's entries (a rename into it) made durable, and a
file replaced whole. Used by everything attnkit writes atomically: model directories,
checkpoints' parents, dataset stores, compiled steps."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Flush ``path``'s directory entries to disk (after a rename into it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a crash leaves the old file (or none), never a part."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
    fsync_dir(path.parent)
