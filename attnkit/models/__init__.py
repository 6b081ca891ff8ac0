"""The four systems of the chapter, each a build function over :mod:`attnkit.nn`."""

from __future__ import annotations

from collections.abc import Callable

from attnkit.config import ModelConfig, preset
from attnkit.models.bert import build_bert
from attnkit.models.core import DecoderOnlyModel, EncoderDecoderModel, EncoderOnlyModel, Model, ModelOutput
from attnkit.models.gpt import build_gpt
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
    return BUILDERS[cfg.family](cfg)


__all__ = [
    "BUILDERS",
    "DecoderOnlyModel",
    "EncoderDecoderModel",
    "EncoderOnlyModel",
    "Model",
    "ModelOutput",
    "build_bert",
    "build_gpt",
    "build_model",
    "build_t5",
    "build_transformer",
]
