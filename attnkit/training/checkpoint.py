"""Crash-safe training checkpoints.

A checkpoint is a directory ``checkpoints/step-00000100`` holding the model as attnkit's own
model directory (``config.json`` + ``model.safetensors``, so :func:`attnkit.from_pretrained`
reads it), the optimiser's tensors in ``optimizer.safetensors``, its hyper-parameters and the
trainer's position (step, data position, RNG states) in ``trainer_state.json`` /
``rng.safetensors``, and a ``COMPLETE`` marker. It is written into a temporary sibling,
fsynced, marked complete, then renamed into place: a directory named ``step-*`` with the
marker is whole, and nothing else is ever resumed (finding them, and building a run's model
from the last: :mod:`attnkit.models.run_dir`); old ones are renamed out of sight before
they are deleted. Only one process writes (rank 0 under torchrun). Nothing is pickled.
A save that fails (a full disk, a read-only directory) removes its temporary directory and
raises :class:`CheckpointSaveError`; the complete checkpoints before it are left as they were.
"""

from __future__ import annotations

import errno
import json
import random
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from torch import Tensor

from attnkit.models.io import CONFIG, FORMAT, FORMAT_VERSION, WEIGHTS, load_safetensors, read_json, write_directory
from attnkit.models.run_dir import CHECKPOINTS, MARKER, checkpoint_dir, complete_checkpoints, latest_checkpoint

_OS_ERROR = re.compile(r"os error (\d+)")  # how safetensors reports the errno of a failed write


class CheckpointSaveError(OSError):
    """A checkpoint could not be written; the complete checkpoints before it are intact."""


def remove_interrupted(run_dir: Path) -> list[Path]:
    """Delete the temporary directories of saves that a killed run left behind (never a
    ``step-*`` directory); returns what was deleted. Call it only while no run writes there."""
    root = Path(run_dir) / CHECKPOINTS
    leftovers = sorted([*root.glob(".step-*.tmp-*"), *root.glob(".step-*.old-*")]) if root.is_dir() else []
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True)
    return leftovers


def _optimizer_files(state: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Split ``optimizer.state_dict()`` into tensors and JSON (no pickle needed)."""
    tensors, scalars = {}, {}
    for param, entry in state["state"].items():  # param: the parameter's name (its FQN)
        for name, value in entry.items():
            if isinstance(value, Tensor):
                tensors[f"{param}.{name}"] = value
            else:
                scalars[f"{param}.{name}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _optimizer_state(tensors: dict[str, Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[str, dict[str, Any]] = {}
    for key, value in [*tensors.items(), *meta["scalars"].items()]:
        param, _, name = key.rpartition(".")  # the state's own names (exp_avg, step) have no dot
        state.setdefault(param, {})[name] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def rng_states() -> tuple[dict[str, Tensor], list[Any]]:
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda.{i}"] = state
    return tensors, list(random.getstate())


def set_rng_states(tensors: dict[str, Tensor], python_state: list[Any]) -> None:
    torch.set_rng_state(tensors["torch"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("cuda.")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    version, internal, gauss = python_state
    random.setstate((version, tuple(internal), gauss))


def save_checkpoint(
    run_dir: Path,
    step: int,
    model_config: dict[str, Any],
    model_state: dict[str, Tensor],
    optimizer_state: dict[str, Any],
    trainer_state: dict[str, Any],
    keep: int,
) -> Path:
    """Write checkpoint ``step`` atomically, then keep only the last ``keep`` complete ones."""
    opt_tensors, opt_meta = _optimizer_files(optimizer_state)
    rng_tensors, python_rng = rng_states()
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "model": model_config}
    files: dict[str, bytes | dict[str, Tensor]] = {
        CONFIG: (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode(),
        WEIGHTS: model_state,
        "optimizer.safetensors": opt_tensors,
        "rng.safetensors": rng_tensors,
        "trainer_state.json": json.dumps(
            {**trainer_state, "step": step, "optimizer": opt_meta, "python_rng": python_rng}, indent=1
        ).encode(),
        MARKER: b"",  # written last: its presence means every file above is on disk
    }
    path = checkpoint_dir(run_dir, step)
    try:
        write_directory(path, files, overwrite=True)
    except (OSError, SafetensorError) as err:
        raise CheckpointSaveError(_save_failure(path, err)) from err
    for old in complete_checkpoints(run_dir)[:-keep]:
        hidden = old.with_name(f".{old.name}.tmp-{uuid.uuid4().hex[:8]}")  # out of sight at once: a kill
        old.rename(hidden)  # mid-delete leaves no partial step-* behind
        shutil.rmtree(hidden)
    return path


def _save_failure(path: Path, err: OSError | SafetensorError) -> str:
    """One line: which save failed, why, what survived and what to do."""
    previous = latest_checkpoint(path.parent.parent)
    kept = f"the last complete one, {previous.name}, is intact" if previous else "no earlier checkpoint exists"
    code = err.errno if isinstance(err, OSError) else None
    if code is None and (found := _OS_ERROR.search(str(err))):
        code = int(found.group(1))
    if code in (errno.ENOSPC, errno.EDQUOT):
        fix = f"free space on the disk of {path.parent} (or lower train.keep_checkpoints)"
    elif code in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = f"make {path.parent} writable"
    else:
        fix = f"fix the cause of the error in {path.parent}"
    return f"could not save checkpoint {path.name} in {path.parent}: {err}; {kept}; {fix}"


def load_checkpoint(path: Path) -> tuple[dict[str, Tensor], dict[str, Any], dict[str, Any]]:
    """(model tensors, optimizer state dict, trainer state) of a complete checkpoint; the RNG
    states are restored as a side effect, once every file has been read and checked."""
    if not (path / MARKER).is_file():
        raise ValueError(f"{path} is not a complete checkpoint (no {MARKER} marker); it was interrupted mid-write")
    trainer_state = read_json(path / "trainer_state.json")
    weights, optimizer_tensors, rng = (
        load_safetensors(path / f) for f in (WEIGHTS, "optimizer.safetensors", "rng.safetensors")
    )
    optimizer = _optimizer_state(optimizer_tensors, trainer_state.pop("optimizer"))
    set_rng_states(rng, trainer_state.pop("python_rng"))
    return weights, optimizer, trainer_state
