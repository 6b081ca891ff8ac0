"""Pieces every family's build function reads from a :class:`~attnkit.config.ModelConfig`."""

from __future__ import annotations

from typing import Any

from torch import nn

from attnkit.config import ModelConfig
from attnkit.nn import (
    DecoderLayer,
    EncoderLayer,
    LayerNorm,
    LearnedPositionalEmbedding,
    RelativePositionBias,
    SinusoidalPositionalEncoding,
)
from attnkit.nn.norm import make_norm


def layer_options(cfg: ModelConfig) -> dict[str, Any]:
    """Keyword arguments shared by the family's encoder and decoder layers."""
    return dict(
        d_model=cfg.d_model,
        n_heads=cfg.n_heads,
        d_ff=cfg.d_ff,
        dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout,
        norm_first=cfg.norm_first,
        activation=cfg.activation,
        gated=cfg.gated,
        bias=cfg.bias,
        norm=cfg.norm,
        eps=cfg.eps,
        scale_scores=cfg.scale_scores,
        d_k=cfg.d_k,
        n_kv_heads=cfg.n_kv_heads,
        rotary_base=cfg.rope_theta if cfg.positional == "rotary" else None,
    )


def encoder_layers(cfg: ModelConfig) -> list[EncoderLayer]:
    return [EncoderLayer(**layer_options(cfg)) for _ in range(cfg.n_layers)]


def decoder_layers(cfg: ModelConfig, cross_attention: bool) -> list[DecoderLayer]:
    n = cfg.decoder_layers if cfg.is_encoder_decoder else cfg.n_layers
    return [DecoderLayer(**layer_options(cfg), cross_attention=cross_attention) for _ in range(n)]


def final_norm(cfg: ModelConfig) -> nn.Module | None:
    """Pre-LN stacks end with a norm (their residual stream is never normalised otherwise)."""
    return make_norm(cfg.norm, cfg.d_model, cfg.eps) if cfg.norm_first else None


def absolute_positions(cfg: ModelConfig) -> nn.Module | None:
    """The positions added to the embeddings; None for T5, whose positions are a bias."""
    if cfg.positional == "sinusoidal":
        return SinusoidalPositionalEncoding(cfg.d_model)
    if cfg.positional == "sinusoidal-halves":
        return SinusoidalPositionalEncoding(cfg.d_model, layout="halves")
    if cfg.positional == "learned":
        return LearnedPositionalEmbedding(cfg.max_len, cfg.d_model)
    return None


def relative_bias(cfg: ModelConfig, bidirectional: bool) -> RelativePositionBias:
    return RelativePositionBias(cfg.n_heads, cfg.relative_buckets, cfg.relative_max_distance, bidirectional)


def embedding_norm(cfg: ModelConfig) -> LayerNorm | None:
    return LayerNorm(cfg.d_model, cfg.eps) if cfg.embedding_norm else None


def classifier(cfg: ModelConfig, bias: bool = True) -> nn.Module | None:
    """The sequence classifier over ``cfg.labels`` (dropout + linear, as transformers'
    ``BertForSequenceClassification``; GPT-2's ``score`` has no bias), None without labels."""
    if not cfg.labels:
        return None
    return nn.Sequential(nn.Dropout(cfg.dropout), nn.Linear(cfg.d_model, len(cfg.labels), bias=bias))


def init_normal(model: nn.Module, std: float) -> None:
    """N(0, std) for every weight matrix and embedding, zeros for biases; norms keep γ=1, β=0."""
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            nn.init.normal_(p, std=std)
        elif not name.endswith("gamma"):
            nn.init.zeros_(p)
