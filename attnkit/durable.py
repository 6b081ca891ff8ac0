"""Writing that survives a crash: a directory's entries (a rename into it) made durable. Used by
everything attnkit writes atomically: model directories, checkpoints' parents, dataset stores."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Flush ``path``'s directory entries to disk (after a rename into it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
