"""``weights="auto"``'s models kept on the disk: what :func:`attnkit.loading.load_auto` chose and
converted for a file is saved once, in attnkit's own format, and later loads of the same file
read it back instead of reading the source, converting every format and running the check again.

On SmolLM2's GGUF file (2-core AMD EPYC, avx512-bf16) that preparation was most of a server's
start: dequantising the file's blocks, quantising to int8 and the check's two forwards, about 4
of the 7.5 s before its first answer. A kept model is read like any saved one (int8 blocks as
they were quantised). As CTranslate2 converts a model once, so does this, but without a step.

An entry is keyed by what decides the choice and the conversion: the source's files (path, size
and modification time of each, a training run's checkpoints among them), the job, attnkit's code
(a hash of its source files, so that a changed quantiser never reads an old entry), torch's
version and the CPU class (its fast formats). Only a quantisation is kept (:data:`KEPT`): bf16
is a cast attnkit does not save, and a model chosen as it was saved is read from its source.
``$ATTNKIT_PREPARED_CACHE`` (default ``~/.cache/attnkit/prepared``) holds the :data:`KEEP` most
recently used entries, each written atomically (``save_pretrained``); one that cannot be read is
dropped with one line and prepared again, and a cache that cannot be written leaves the load as
it was, with one line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import torch

from attnkit.machine import code_identity, cpu_class
from attnkit.models import Model, auto, load_saved
from attnkit.models.auto import Choice, Job

log = logging.getLogger("attnkit")

CACHE_ENV = "ATTNKIT_PREPARED_CACHE"
KEEP = 4  # entries kept; SmolLM2-135M's int8 entry is 246 MB
KEPT = ("int8", "int4")  # the formats kept: quantisations, slow to make
CHOICE = "choice.json"


def root() -> Path:
    """The cache's directory (``$ATTNKIT_PREPARED_CACHE``, default ``~/.cache/attnkit/prepared``)."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "attnkit" / "prepared")


def entry(source: Path, job: Job) -> Path:
    """Where the model prepared from ``source`` for ``job`` is kept on this machine."""
    files = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else [source]
    stats = [(str(p.relative_to(source)) if p != source else p.name, p.stat()) for p in files]
    identity = {
        "source": str(source.resolve()),
        "files": [(name, stat.st_size, stat.st_mtime_ns) for name, stat in stats],
        "job": job,
        "attnkit": code_identity(),
        "torch": torch.__version__,
        "cpu_class": cpu_class().name,
        "order": auto.ORDER[job],
        "bounds": auto.BOUNDS,
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return root() / f"{source.name}-{job}-{digest}"


def read(source: Path, job: Job) -> tuple[Model, Choice] | None:
    """The model kept for ``source`` and ``job`` and its choice, or None where there is none or
    it cannot be read (then dropped, with one line)."""
    path = entry(source, job)
    if not (path / CHOICE).is_file():
        return None
    try:
        choice = Choice(**json.loads((path / CHOICE).read_text()))
        model = load_saved(path)
    except (OSError, ValueError, TypeError, KeyError, RuntimeError) as error:
        log.warning("the prepared model %s cannot be read (%s); preparing it again from %s", path, error, source)
        shutil.rmtree(path, ignore_errors=True)
        return None
    os.utime(path)  # most recently used
    return model, Choice(choice.weights, f"{choice.reason} (checked when first loaded; kept in {path})")


def write(source: Path, job: Job, model: Model, choice: Choice) -> None:
    """Keep ``model`` as prepared from ``source`` for ``job``; a cache that cannot be written is
    left alone, with one line."""
    path = entry(source, job)
    try:
        model.save_pretrained(path, overwrite=True)
        (path / CHOICE).write_text(json.dumps(asdict(choice)))
        _forget_beyond(KEEP)
    except OSError as error:
        log.warning(
            "the prepared model cannot be kept in %s (%s); the next load prepares it again: set %s to a "
            "writable directory", path, error.strerror or error, CACHE_ENV,
        )  # fmt: skip


def _forget_beyond(keep: int) -> None:
    entries = sorted((p for p in root().iterdir() if p.is_dir() and not p.name.startswith(".")),
                     key=lambda p: p.stat().st_mtime, reverse=True)  # fmt: skip
    for stale in entries[keep:]:
        shutil.rmtree(stale, ignore_errors=True)
