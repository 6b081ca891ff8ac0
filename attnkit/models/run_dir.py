"""A training run's directory, read: ``run.json`` (the run config, beside the record of the
machine the run was fitted to), ``tokenizer.json`` and ``checkpoints/step-*``, of which the
complete ones are found and the last is built into the run's model.

Training writes a run directory (:mod:`attnkit.training.run`, :mod:`attnkit.training.checkpoint`);
everything that reads one (the loader, a resumed run, the commands, the chapter) reads it here,
below them all. A checkpoint is a directory ``checkpoints/step-00000100`` holding the model as
attnkit's own model directory and a ``COMPLETE`` marker, written last: a ``step-*`` directory
with the marker is whole, and nothing else is read.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from attnkit.config import RunConfig, run_from_dict
from attnkit.models import Model, load_saved
from attnkit.models.io import CONFIG, attach_tokenizer

RUN_CONFIG = "run.json"
MACHINE = "machine"  # run.json's record of the machine the run was fitted to (beside model, train, data)
CHECKPOINTS = "checkpoints"
MARKER = "COMPLETE"
_NAME = re.compile(r"^step-(\d{8})$")


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINTS / f"step-{step:08d}"


def checkpoint_step(path: Path) -> int:
    """The step of checkpoint directory ``path`` (``step-00000100`` -> 100)."""
    return int(_NAME.match(path.name).group(1))


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first. Half-written ones (no marker, or still
    under a temporary name) are ignored."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _NAME.match(p.name) and (p / MARKER).is_file()]
    return sorted(found, key=checkpoint_step)


def latest_checkpoint(run_dir: Path) -> Path | None:
    complete = complete_checkpoints(run_dir)
    return complete[-1] if complete else None


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` is a training run's directory rather than a model's: checkpoints, and no
    ``config.json`` of its own."""
    return not (path / CONFIG).exists() and (path / CHECKPOINTS).is_dir()


def write_run_config(run_dir: Path, run: RunConfig, machine: dict[str, Any] | None) -> None:
    """``run.json``: the run config, and beside it the ``machine`` record (what it was fitted to)."""
    payload = run.to_dict() | ({MACHINE: machine} if machine is not None else {})
    (run_dir / RUN_CONFIG).write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")


def read_run_config(run_dir: str | Path) -> tuple[RunConfig, dict[str, Any] | None]:
    """The run config of ``run.json`` and its machine record as written (None for runs written
    before it); a directory without one is refused with the fix."""
    path = Path(run_dir) / RUN_CONFIG
    if not path.exists():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no {RUN_CONFIG}); pass the --out of attnkit train")
    payload = json.loads(path.read_text(encoding="utf-8"))
    record = payload.pop(MACHINE, None) if isinstance(payload, dict) else None
    return run_from_dict(payload), record


def run_model(run_dir: Path) -> Model:
    """The model of a training run's directory: its latest complete checkpoint, with the run's
    tokenizer."""
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        raise FileNotFoundError(f"{run_dir} is a run directory without a complete checkpoint yet; train it further")
    model = load_saved(checkpoint)
    attach_tokenizer(model, run_dir)
    return model
