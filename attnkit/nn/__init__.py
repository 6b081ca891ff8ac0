"""The chapter's components: plain numbers in, tensors out, never a config object."""

from attnkit.nn.attention import (
    MultiHeadAttention,
    attention_fused,
    attention_math,
    scaled_dot_product_attention,
)
from attnkit.nn.cache import DecoderCache, KVCache
from attnkit.nn.feedforward import FeedForward
from attnkit.nn.layers import AddNorm, DecoderLayer, EncoderLayer
from attnkit.nn.masks import causal_mask, lengths_to_mask, padding_mask
from attnkit.nn.norm import LayerNorm, RMSNorm
from attnkit.nn.positional import (
    LearnedPositionalEmbedding,
    RelativePositionBias,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    relative_position_bucket,
    sinusoidal_table,
)
from attnkit.nn.stacks import Decoder, Encoder

__all__ = [
    "AddNorm",
    "Decoder",
    "DecoderCache",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "KVCache",
    "LayerNorm",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "RMSNorm",
    "RelativePositionBias",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "attention_fused",
    "attention_math",
    "causal_mask",
    "lengths_to_mask",
    "padding_mask",
    "relative_position_bucket",
    "scaled_dot_product_attention",
    "sinusoidal_table",
]
