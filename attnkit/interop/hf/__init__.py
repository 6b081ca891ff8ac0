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

from attnkit.config import ModelConfig
from attnkit.interop.hf import bert, gpt2, llama, marian, t5
from attnkit.interop.hf.common import special_ids_to_hf
from attnkit.models import build_loaded
from attnkit.models.generation_config import GENERATION_CONFIG, write_generation_config
from attnkit.models.io import (
    CONFIG,
    WEIGHTS,
    WEIGHTS_INDEX,
    attach_tokenizer,
    check_savable,
    read_safetensors,
    shard,
    tokenizer_files,
    write_directory,
)

CONVERTERS: dict[str, ModuleType] = {"gpt2": gpt2, "llama": llama, "bert": bert, "t5": t5, "marian": marian}
EXPORTS: dict[str, ModuleType] = {"gpt": gpt2, "bert": bert, "t5": t5, "transformer": marian}


def _exporter(config: ModelConfig) -> ModuleType:
    """The converter a model exports with: its family's, Llama's for a GPT with rotary positions."""
    if config.family == "gpt" and config.positional == "rotary":
        return llama
    return EXPORTS[config.family]


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
    attach_tokenizer(model, directory, hugging_face=True)
    return model.eval()


# transformers' default max_shard_size (5 GB).
MAX_SHARD_BYTES = 5 * 10**9


def export_hf(
    model: torch.nn.Module, path: str | Path, overwrite: bool = False, max_shard_bytes: int = MAX_SHARD_BYTES
) -> None:
    """Write ``model`` as a Hugging Face directory that ``transformers`` loads with its
    ``from_pretrained`` and that gives the same logits; weights above ``max_shard_bytes``
    are split into shards with a ``model.safetensors.index.json``, as ``transformers`` does.

    With a tokenizer the directory is whole for ``AutoTokenizer``, pipelines and
    lm-evaluation-harness's ``hf`` model (:func:`~attnkit.models.io.tokenizer_files`), and its
    ``tokenizer.json`` adds the specials attnkit adds itself, so that ``encode`` gives attnkit's
    ids; only a text that already spells them out gets them twice there, and an empty source
    is ``[</s>]`` there, empty in attnkit."""
    from attnkit.nn.lora import merged_copy

    check_savable(model)
    model = merged_copy(model)  # LoRA adapters folded into their weights
    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
    config = model.config
    converter = _exporter(config)
    hf_config = converter.config_to_hf(config)
    tensors = {
        k: v.detach().clone().contiguous() for k, v in converter.to_hf(dict(model.named_parameters()), config).items()
    }
    files: dict[str, bytes | dict[str, torch.Tensor]] = {
        CONFIG: (json.dumps(hf_config, indent=2, sort_keys=True) + "\n").encode()
    }
    shards = shard(tensors, max_shard_bytes)
    if len(shards) == 1:
        files[WEIGHTS] = tensors
    else:
        files.update(shards)
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map = {name: file for file, group in shards.items() for name in group}
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        files[WEIGHTS_INDEX] = (json.dumps(index, indent=2, sort_keys=True) + "\n").encode()
    files.update(tokenizer_files(model, hugging_face=True))
    special = {**special_ids_to_hf(config), "decoder_start_token_id": config.decoder_start_token_id}
    defaults = {k: v for k, v in special.items() if v is not None} | dict(model.generation_defaults)
    files[GENERATION_CONFIG] = write_generation_config(defaults)
    write_directory(path, files, overwrite)
