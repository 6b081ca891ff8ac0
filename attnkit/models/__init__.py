"""The four systems of the chapter, each a build function over :mod:`attnkit.nn`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from attnkit.config import ModelConfig, preset
from attnkit.models.bert import build_bert
from attnkit.models.core import DecoderOnlyModel, EncoderDecoderModel, EncoderOnlyModel, Model, ModelOutput
from attnkit.models.gpt import build_gpt
from attnkit.models.io import (
    CONFIG,
    WEIGHTS,
    attach_tokenizer,
    check_weights,
    copy_weights,
    read_json,
    read_safetensors,
    refuse_pickles,
    saved_config,
)
from attnkit.models.t5 import build_t5
from attnkit.models.transformer import build_transformer

BUILDERS: dict[str, Callable[[ModelConfig], Model]] = {
    "transformer": build_transformer,
    "bert": build_bert,
    "gpt": build_gpt,
    "t5": build_t5,
}


def build_model(config: ModelConfig | str) -> Model:
    """A freshly initialised model of ``config`` (or of the preset of that name)."""
    cfg = preset(config) if isinstance(config, str) else config
    model = BUILDERS[cfg.family](cfg)
    if cfg.lora_rank:  # the pretrained part frozen, low-rank adapters on the chosen projections
        from attnkit.nn import lora

        lora.add(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets)
    return model


def build_loaded(
    config: ModelConfig, tensors: dict[str, Tensor], source: str, layers: dict[str, str] | None = None
) -> Model:
    """The model of ``config`` holding ``tensors``, its ``layers`` quantised as named
    (:func:`attnkit.nn.quantized.layouts` of a saved model; their blocks are in ``tensors``).
    They are checked against a build on the meta device first, which allocates nothing: a
    config.json that disagrees with the file, however large the model it describes, fails
    before any memory is taken."""
    from attnkit.models.weights import quantized_shell
    from attnkit.nn.quantized import quantized_buffers

    def built() -> Model:
        return quantized_shell(build_model(config), layers) if layers else build_model(config)

    with torch.device("meta"), _without_random_init():  # meta's initialisers run as Python refs: 8 ms each
        shell = built()
        check_weights(shell, tensors, source, quantized_buffers(shell))
    with _without_random_init():  # every parameter is in ``tensors`` (just checked), copied next
        model = built()
    copy_weights(model, tensors, quantized_buffers(model))
    return model


@contextlib.contextmanager
def _without_random_init() -> Iterator[None]:
    """``torch.nn.init``'s initialisers as no-ops while a model is built whose every parameter is
    then overwritten: drawing its random weights was 2.3 s of SmolLM2's 6.3 s load. Process-wide
    while it lasts (as ``transformers``' ``no_init_weights``)."""
    names = [name for name in vars(torch.nn.init) if name.endswith("_") and not name.startswith("_")]
    kept = {name: getattr(torch.nn.init, name) for name in names}
    try:
        for name in names:
            setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, function in kept.items():
            setattr(torch.nn.init, name, function)


def load_saved(directory: str | Path, config_json: dict[str, Any] | None = None) -> Model:
    """The model (with its tokenizer, where there is one) of attnkit's own directory, as
    :meth:`Model.save_pretrained` and the training checkpoints write it, quantised layers as
    they were saved. ``config_json``: its ``config.json``, where the caller has already read it
    (and checked the directory for pickles)."""
    from attnkit.models.weights import finish_format, saved_layers

    directory = Path(directory)
    if config_json is None:
        refuse_pickles(directory)
        config_json = read_json(directory / CONFIG)
    config = saved_config(directory, config_json)
    weights, layers = saved_layers(config_json.get("weights"), directory / CONFIG)
    model = build_loaded(config, read_safetensors(directory), str(directory / WEIGHTS), layers)
    attach_tokenizer(model, directory)
    return finish_format(model, weights) if layers else model.eval()


__all__ = [
    "BUILDERS",
    "DecoderOnlyModel",
    "EncoderDecoderModel",
    "EncoderOnlyModel",
    "Model",
    "ModelOutput",
    "build_bert",
    "build_gpt",
    "build_loaded",
    "build_model",
    "build_t5",
    "build_transformer",
    "load_saved",
]
