"""attnkit: the chapter "Attention and Transformers" as a library."""

from attnkit.config import ModelConfig, preset
from attnkit.interop.hf import export_hf
from attnkit.models import build_model
from attnkit.models.io import from_pretrained

__version__ = "0.1.0"

__all__ = ["ModelConfig", "__version__", "build_model", "export_hf", "from_pretrained", "preset"]
