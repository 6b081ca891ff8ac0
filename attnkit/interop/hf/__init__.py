"""Hugging Face directories (``config.json`` + ``model.safetensors``) in and out.

Each supported ``model_type`` has a module here with four functions:
``config_from_hf(data) -> ModelConfig``, ``config_to_hf(cfg) -> dict``,
``to_attnkit(tensors, cfg) -> dict`` and ``to_hf(tensors, cfg) -> dict``, the last two
mapping parameter names (and layouts) between the two sides. A module may also define
``config_from_tensors(cfg, tensors) -> ModelConfig``, to settle what ``config.json`` leaves
open from the tensors present (BERT: whether there is a pooler, an MLM head), and may raise a
``ValueError`` from ``to_attnkit`` naming keys by the checkpoint's own names.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from attnkit.interop.hf import bert, gpt2, marian, t5
from attnkit.models.io import (
    CONFIG,
    TOKENIZER,
    WEIGHTS,
    attach_tokenizer,
    build_loaded,
    read_safetensors,
    write_directory,
)

CONVERTERS: dict[str, ModuleType] = {"gpt2": gpt2, "bert": bert, "t5": t5, "marian": marian}
EXPORTS: dict[str, ModuleType] = {"gpt": gpt2, "bert": bert, "t5": t5, "transformer": marian}


def load_hf(directory: Path, data: dict[str, Any]) -> torch.nn.Module:
    """Build the attnkit model of a Hugging Face directory and load its weights, checked whole."""
    model_type = data.get("model_type")
    if model_type not in CONVERTERS:
        raise ValueError(
            f"{directory / CONFIG}: model_type {model_type!r} is not one attnkit reads "
            f"(supported: {', '.join(CONVERTERS)}; or a directory written by attnkit's save_pretrained)"
        )
    converter = CONVERTERS[model_type]
    try:
        config = converter.config_from_hf(data)
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{directory / CONFIG}: cannot read this {model_type} config: {err}") from None
    tensors = read_safetensors(directory)
    if hasattr(converter, "config_from_tensors"):
        config = converter.config_from_tensors(config, tensors)
    try:
        weights = converter.to_attnkit(tensors, config)
    except (ValueError, RuntimeError) as err:  # RuntimeError: torch on a tensor of the wrong rank
        raise ValueError(f"cannot load {directory / WEIGHTS}: {err}") from None
    model = build_loaded(config, weights, str(directory / WEIGHTS))
    attach_tokenizer(model, directory)
    return model.eval()


def export_hf(model: torch.nn.Module, path: str | Path, overwrite: bool = False) -> None:
    """Write ``model`` as a Hugging Face directory that ``transformers`` loads with its
    ``from_pretrained`` and that gives the same logits."""
    config = model.config
    converter = EXPORTS[config.family]
    hf_config = converter.config_to_hf(config)
    tensors = converter.to_hf(dict(model.named_parameters()), config)
    files = {
        CONFIG: (json.dumps(hf_config, indent=2, sort_keys=True) + "\n").encode(),
        WEIGHTS: {k: v.detach().clone().contiguous() for k, v in tensors.items()},
    }
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is not None:
        files[TOKENIZER] = tokenizer.to_str().encode()
    write_directory(path, files, overwrite)


def strip_prefix(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """Drop ``prefix`` from the keys that have it (task-head checkpoints nest the base model)."""
    return {k.removeprefix(prefix): v for k, v in tensors.items()}


def unsupported(data: dict[str, Any], defaults: dict[str, Any], model_type: str) -> None:
    """Raise if ``data`` sets an option attnkit does not implement to a non-default value."""
    for key, default in defaults.items():
        if key in data and data[key] != default:
            raise ValueError(f"{model_type} option {key}={data[key]!r} is not supported (only {default!r})")


def token_id(data: dict[str, Any], key: str) -> int | None:
    """A special token id of a Hugging Face config, or None where it is unset or outside the
    vocabulary (small test configs keep GPT-2's 50256 with a vocabulary of 100)."""
    value = data.get(key)
    if isinstance(value, list):  # generation configs may list several end tokens
        value = value[0] if value else None
    return value if isinstance(value, int) and 0 <= value < data["vocab_size"] else None
