"""attnkit: the chapter "Attention and Transformers" as a library.

The names below are imported on first use, so that ``import attnkit`` (and the command line's
``--help``) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "ModelConfig": "attnkit.config",
    "preset": "attnkit.config",
    "build_model": "attnkit.models",
    "export_hf": "attnkit.interop.hf",
    "from_pretrained": "attnkit.loading",
}

if TYPE_CHECKING:
    from attnkit.config import ModelConfig, preset
    from attnkit.interop.hf import export_hf
    from attnkit.loading import from_pretrained
    from attnkit.models import build_model


# The names that build or load models: their models decode, with the generate() that
# attnkit.generation gives every model when it is imported (the models do not import it).
_MAKE_MODELS = ("build_model", "from_pretrained")


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'attnkit' has no attribute {name!r}")
    if name in _MAKE_MODELS:
        importlib.import_module("attnkit.generation")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = ["ModelConfig", "__version__", "build_model", "export_hf", "from_pretrained", "preset"]
