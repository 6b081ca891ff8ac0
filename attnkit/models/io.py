"""Model directories: attnkit's own (``config.json`` + ``model.safetensors``), and the entry
point that also reads Hugging Face directories through :mod:`attnkit.interop`.

Weights are read only from safetensors, never unpickled; a load either checks out whole
(every key, shape, dtype, finite values) or raises and loads nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from attnkit.config import ModelConfig, from_dict

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
TOKENIZER = "tokenizer.json"
FORMAT = "attnkit"
FORMAT_VERSION = 1
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} not found: a model directory needs {CONFIG}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); the directory is corrupt") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def read_safetensors(directory: Path) -> dict[str, Tensor]:
    """All tensors of ``directory/model.safetensors``; pickles are refused, never opened."""
    path = directory / WEIGHTS
    if not path.exists():
        pickles = sorted(p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise ValueError(
                f"{directory} holds only pickled weights ({', '.join(pickles)}), which attnkit never loads "
                "(unpickling can run arbitrary code); convert them to model.safetensors in a sandbox you "
                "trust, e.g. with transformers' save_pretrained(..., safe_serialization=True)"
            )
        raise FileNotFoundError(f"{path} not found: a model directory needs {WEIGHTS}")
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise ValueError(f"{path} is not a readable safetensors file ({err}); it may be truncated") from None


def load_weights(model: torch.nn.Module, tensors: dict[str, Tensor], source: str) -> None:
    """Copy ``tensors`` into ``model``'s parameters after checking all of them; on any
    problem raise a ``ValueError`` listing every offending key, having changed nothing."""
    params = dict(model.named_parameters())
    problems = []
    missing = sorted(set(params) - set(tensors))
    unexpected = sorted(set(tensors) - set(params))
    if missing:
        problems.append(f"missing keys: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {', '.join(unexpected)}")
    for name in sorted(set(params) & set(tensors)):
        t, p = tensors[name], params[name]
        if t.shape != p.shape:
            problems.append(f"{name}: shape {tuple(t.shape)} in the file, {tuple(p.shape)} in the config")
        elif not t.dtype.is_floating_point:
            problems.append(f"{name}: dtype {t.dtype}, expected a floating-point dtype")
        elif not bool(torch.isfinite(t).all()):
            problems.append(f"{name}: holds NaN or Inf values")
    if problems:
        raise ValueError(f"cannot load {source}: " + "; ".join(problems))
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(tensors[name])


def attach_tokenizer(model: torch.nn.Module, directory: Path) -> None:
    """Set ``model.tokenizer`` (a ``tokenizers.Tokenizer``) from ``directory/tokenizer.json``
    where the directory has one, attnkit's or Hugging Face's."""
    path = directory / TOKENIZER
    if path.exists():
        from attnkit.data.tokenizer import load_tokenizer

        model.tokenizer = load_tokenizer(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_directory(path: str | Path, files: dict[str, bytes | dict[str, Tensor]], overwrite: bool) -> None:
    """Write ``files`` (name -> JSON/text bytes, or a tensor dict for safetensors) into a
    temporary sibling directory, fsync it, then rename it into place. An existing non-empty
    ``path`` is only replaced with ``overwrite=True``, and only once the new one is complete."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"{path} exists and is not a directory; choose another path")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise FileExistsError(f"{path} already exists and is not empty; pass overwrite=True or choose another path")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        for name, content in files.items():
            target = tmp / name
            if isinstance(content, dict):
                save_file({k: v.detach().contiguous() for k, v in content.items()}, target, metadata={"format": "pt"})
            else:
                target.write_bytes(content)
            with open(target, "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(tmp)
        old = None
        if path.exists():
            old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
            path.rename(old)
        tmp.rename(path)
        _fsync_dir(path.parent)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def save_pretrained(model: torch.nn.Module, path: str | Path, overwrite: bool = False) -> None:
    """attnkit's directory: config.json (format, version, model config) and model.safetensors."""
    config: ModelConfig = model.config
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "model": config.to_dict()}
    files: dict[str, bytes | dict[str, Tensor]] = {
        CONFIG: (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode(),
        WEIGHTS: dict(model.named_parameters()),
    }
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is not None:
        files[TOKENIZER] = tokenizer.to_str().encode()
    write_directory(path, files, overwrite)


def from_pretrained(path: str | Path) -> torch.nn.Module:
    """Load attnkit's own directory, a training run's directory (its latest complete
    checkpoint, with the run's tokenizer), or a Hugging Face one (``gpt2``, ``bert``, ``t5``,
    ``marian``). Weights come only from safetensors; nothing is unpickled."""
    from attnkit.models import build_model

    directory = Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a directory; pass a directory written by save_pretrained")
    if not (directory / CONFIG).exists() and (directory / "checkpoints").is_dir():
        return _from_run(directory)
    data = read_json(directory / CONFIG)
    if data.get("format") != FORMAT:
        from attnkit.interop.hf import load_hf

        return load_hf(directory, data)
    if data.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{directory / CONFIG}: format_version {data.get('format_version')!r} is not one this attnkit "
            f"reads ({FORMAT_VERSION}); upgrade attnkit"
        )
    unknown = sorted(set(data) - {"format", "format_version", "model"})
    if unknown:
        raise ValueError(f"{directory / CONFIG}: unknown fields {', '.join(unknown)}")
    try:
        config = from_dict(data.get("model"))
    except ValueError as err:
        raise ValueError(f"{directory / CONFIG}: {err}") from None
    tensors = read_safetensors(directory)
    model = build_model(config)
    load_weights(model, tensors, str(directory))
    attach_tokenizer(model, directory)
    return model.eval()


def _from_run(run_dir: Path) -> torch.nn.Module:
    from attnkit.training.checkpoint import latest_checkpoint

    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        raise FileNotFoundError(f"{run_dir} is a run directory without a complete checkpoint yet; train it further")
    model = from_pretrained(checkpoint)
    attach_tokenizer(model, run_dir)
    return model
