"""What the converters of :mod:`attnkit.interop.hf` share: reading a Hugging Face config's
options and special ids, and renaming checkpoint keys."""

from __future__ import annotations

from typing import Any

import torch


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


def lm_special_ids(data: dict[str, Any]) -> dict[str, int | None]:
    """A decoder-only LM's special ids from its Hugging Face config; the pad id falls back to
    the end token's (GPT-2 and Llama checkpoints often set none), then to 0."""
    return {
        "bos_token_id": token_id(data, "bos_token_id"),
        "eos_token_id": token_id(data, "eos_token_id"),
        "pad_token_id": token_id(data, "pad_token_id") or token_id(data, "eos_token_id") or 0,
    }


def special_ids_to_hf(cfg: Any) -> dict[str, int | None]:
    """The special ids of an attnkit config, under Hugging Face's keys."""
    return {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id}


def label_names(data: dict[str, Any]) -> tuple[str, ...]:
    """The label names of a classifier's config: ``id2label`` in id order, else LABEL_i."""
    id2label = data.get("id2label")
    if isinstance(id2label, dict) and id2label:
        try:
            ordered = sorted((int(k), v) for k, v in id2label.items())
        except (TypeError, ValueError):
            raise ValueError(f"id2label must map ids to names, got {id2label}") from None
        if [i for i, _ in ordered] != list(range(len(ordered))) or not all(isinstance(v, str) for _, v in ordered):
            raise ValueError(f"id2label must name every id 0..n-1 once, got {id2label}")
        return tuple(v for _, v in ordered)
    return tuple(f"LABEL_{i}" for i in range(int(data.get("num_labels", 2))))


def labels_to_hf(labels: tuple[str, ...]) -> dict[str, Any]:
    """A classifier's label names as transformers' config keeps them."""
    return {"id2label": dict(enumerate(labels)), "label2id": {name: i for i, name in enumerate(labels)}}
