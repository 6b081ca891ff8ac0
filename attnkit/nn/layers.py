"""The Transformer block (chapter §The Transformer Block, [fig:att-transformer]).

An encoder layer is self-attention then the FFN; a decoder layer is masked self-attention,
cross-attention on the encoder's output, then the FFN. Each sub-layer is wrapped in
:class:`AddNorm`, the chapter's "Add & Norm".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

from torch import Tensor, nn
from typing_extensions import Unpack

from attnkit.nn.attention import MultiHeadAttention
from attnkit.nn.cache import BeamKVCache, KVCache
from attnkit.nn.feedforward import Activation, FeedForward
from attnkit.nn.norm import NormKind, make_norm
from attnkit.nn.positional import RotaryEmbedding

# Attention weights collected during a forward pass: {"self": [...], "cross": [...]},
# one (B, H, n, m) tensor per layer, in layer order.
AttentionRecord = dict[str, list[Tensor]]


class AddNorm(nn.Module):
    """The residual sub-layer wrapper of [eq:att-addnorm].

    post-LN (``norm_first=False``, the chapter's and the paper's): LN(x + Dropout(F(x))).
    pre-LN (``norm_first=True``, GPT-2, T5 and most modern stacks): x + Dropout(F(LN(x))),
    which leaves the residual path free of normalisation.
    """

    def __init__(
        self, d_model: int, dropout: float, norm_first: bool, norm: NormKind = "layer", eps: float = 1e-5
    ) -> None:
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.norm_first = norm_first
        self.norm = make_norm(norm, d_model, eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class LayerOptions(TypedDict, total=False):
    """The knobs of :class:`EncoderLayer` and :class:`DecoderLayer`, each a real variant."""

    attention_dropout: float | None  # dropout on the attention weights; None = dropout
    norm_first: bool  # pre-LN [eq:att-addnorm] (GPT-2, T5)
    activation: Activation  # the FFN's non-linearity (BERT: gelu, GPT-2: gelu_tanh, Marian: silu)
    gated: bool  # gated FFN (T5 v1.1)
    bias: bool  # False: no biases in the linear maps (T5)
    norm: NormKind  # "rms" (T5)
    eps: float  # the norm's epsilon (BERT: 1e-12)
    scale_scores: bool  # False: no 1/√d_k (T5)
    d_k: int | None  # per-head width; None = d_model / n_heads
    n_kv_heads: int | None  # grouped-query self-attention (Llama); None = n_heads
    rotary_base: float | None  # rotary positions in self-attention, θ_i = base^(-2i/d) (Llama); None = none


@dataclass(frozen=True)
class _Sublayers:
    """Builds the sub-layers shared by encoder and decoder layers from plain numbers."""

    d_model: int
    n_heads: int
    d_ff: int
    dropout: float
    attention_dropout: float | None = None
    norm_first: bool = False
    activation: Activation = "relu"
    gated: bool = False
    bias: bool = True
    norm: NormKind = "layer"
    eps: float = 1e-5
    scale_scores: bool = True
    d_k: int | None = None
    n_kv_heads: int | None = None
    rotary_base: float | None = None

    def attention(self, self_attention: bool = True) -> MultiHeadAttention:
        """Self-attention (with the rotary positions and key/value heads, when set) or cross-attention."""
        dropout = self.dropout if self.attention_dropout is None else self.attention_dropout
        rotary = None
        if self_attention and self.rotary_base is not None:
            rotary = RotaryEmbedding(self.d_k or self.d_model // self.n_heads, self.rotary_base, layout="halves")
        return MultiHeadAttention(
            self.d_model, self.n_heads, self.d_k, self.d_k, dropout, self.bias, self.scale_scores, rotary,
            self.n_kv_heads if self_attention else None,
        )  # fmt: skip

    def ffn(self) -> FeedForward:
        return FeedForward(self.d_model, self.d_ff, self.activation, self.gated, self.dropout, self.bias)

    def add_norm(self) -> AddNorm:
        return AddNorm(self.d_model, self.dropout, self.norm_first, self.norm, self.eps)


def _attend(
    attention: MultiHeadAttention,
    x: Tensor,
    record: AttentionRecord | None,
    key: str,
    **kwargs: object,
) -> Tensor:
    """Run ``attention`` on ``x``; when recording, keep its weights under ``record[key]``."""
    out, weights = attention(x, return_weights=record is not None, **kwargs)
    if record is not None:
        record.setdefault(key, []).append(weights)
    return out


class EncoderLayer(nn.Module):
    """One encoder layer of [fig:att-transformer]: self-attention and the FFN [eq:att-ffn],
    each in Add & Norm [eq:att-addnorm]. Equal to ``torch.nn.TransformerEncoderLayer`` with the
    same weights (a test holds them equal for both ``norm_first``).

    The knobs are :class:`LayerOptions`.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        **options: Unpack[LayerOptions],
    ) -> None:
        super().__init__()
        parts = _Sublayers(d_model, n_heads, d_ff, dropout, **options)
        self.self_attn, self.add_norm_self = parts.attention(), parts.add_norm()
        self.ffn, self.add_norm_ffn = parts.ffn(), parts.add_norm()

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        position_bias: Tensor | None = None,
        record: AttentionRecord | None = None,
    ) -> Tensor:
        """``x`` (B, T, d_model); ``mask`` bool broadcastable to (B, H, T, T)."""
        x = self.add_norm_self(
            x, lambda h: _attend(self.self_attn, h, record, "self", mask=mask, position_bias=position_bias)
        )
        return self.add_norm_ffn(x, self.ffn)


class DecoderLayer(nn.Module):
    """One decoder layer of [fig:att-transformer]: masked self-attention [eq:att-masked],
    cross-attention on the encoder output ``memory`` (omitted with ``cross_attention=False``,
    as in GPT), and the FFN [eq:att-ffn], each in Add & Norm [eq:att-addnorm].
    Equal to ``torch.nn.TransformerDecoderLayer`` with the same weights.

    The knobs are :class:`LayerOptions`.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        *,
        cross_attention: bool = True,
        **options: Unpack[LayerOptions],
    ) -> None:
        super().__init__()
        parts = _Sublayers(d_model, n_heads, d_ff, dropout, **options)
        self.self_attn, self.add_norm_self = parts.attention(), parts.add_norm()
        self.cross_attn = parts.attention(self_attention=False) if cross_attention else None
        self.add_norm_cross = parts.add_norm() if cross_attention else None
        self.ffn, self.add_norm_ffn = parts.ffn(), parts.add_norm()

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        position_bias: Tensor | None = None,
        self_cache: KVCache | BeamKVCache | None = None,
        cross_cache: KVCache | None = None,
        record: AttentionRecord | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """``x`` (B, n, d_model) new target positions; ``memory`` (B, m, d_model).

        Self-attention is always causal [eq:att-mask]; ``mask`` (bool, broadcastable to
        (B, H, n, n_cached + n)) adds to it, e.g. the target's key padding. ``memory_mask``
        broadcastable to (B, H, n, m). With caches, only the new positions are fed and the
        earlier keys/values come from ``self_cache``. ``positions`` (B, n): the rotary
        positions of the new ones, where the layer has rotary self-attention.
        """
        x = self.add_norm_self(
            x,
            lambda h: _attend(
                self.self_attn,
                h,
                record,
                "self",
                mask=mask,
                position_bias=position_bias,
                cache=self_cache,
                is_causal=True,
                positions=positions,
            ),
        )
        if self.cross_attn is not None:
            if memory is None and (cross_cache is None or cross_cache.k is None):
                raise ValueError("this decoder layer has cross-attention: pass the encoder output as memory")
            x = self.add_norm_cross(
                x,
                lambda h: _attend(
                    self.cross_attn, h, record, "cross", memory=memory, mask=memory_mask, cache=cross_cache
                ),
            )
        return self.add_norm_ffn(x, self.ffn)
