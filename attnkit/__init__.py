"""attnkit: the chapter "Attention and Transformers" as a library."""

__version__ = "0.1.0"
