"""The two columns of [fig:att-transformer]: a stack of N encoder layers and a stack of N
decoder layers, each with an optional final norm (pre-LN stacks need one: their residual
stream is never normalised otherwise)."""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor, nn

from attnkit.nn.cache import DecoderCache
from attnkit.nn.layers import AttentionRecord, DecoderLayer, EncoderLayer
from attnkit.nn.positional import RelativePositionBias


class _Stack(nn.Module):
    """N layers, an optional final norm, and ``position_bias``: T5's relative bias, computed
    once per forward and shared by all layers. Embeddings and absolute positions belong to the
    model, not the stack."""

    def __init__(
        self,
        layers: Iterable[EncoderLayer] | Iterable[DecoderLayer],
        final_norm: nn.Module | None = None,
        position_bias: RelativePositionBias | None = None,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.final_norm = final_norm
        self.position_bias = position_bias


class Encoder(_Stack):
    """N encoder layers (left column of [fig:att-transformer])."""

    def forward(self, x: Tensor, mask: Tensor | None = None, record: AttentionRecord | None = None) -> Tensor:
        """``x`` (B, T, d_model) -> (B, T, d_model); ``mask`` bool, broadcastable to (B, H, T, T)."""
        T = x.shape[1]
        bias = self.position_bias(T, T) if self.position_bias is not None else None
        for layer in self.layers:
            x = layer(x, mask=mask, position_bias=bias, record=record)
        return x if self.final_norm is None else self.final_norm(x)


class Decoder(_Stack):
    """N decoder layers (right column of [fig:att-transformer]), always causal [eq:att-mask].

    With a :class:`~attnkit.nn.cache.DecoderCache` only the new positions are fed; the
    cached ones count for the causal mask and the relative bias.
    """

    @property
    def cross_attention(self) -> bool:
        return any(layer.cross_attn is not None for layer in self.layers)

    def new_cache(self, capacity: int = 64, groups: int = 1, fixed: bool = False) -> DecoderCache:
        """An empty cache for incremental decoding with this stack; ``capacity`` positions are
        allocated up front (the buffers double when a longer sequence needs more, unless
        ``fixed``: the compiled step's); ``groups`` beams per example for beam search
        (:class:`~attnkit.nn.cache.BeamKVCache`)."""
        return DecoderCache(len(self.layers), self.cross_attention, capacity, groups, fixed)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
        record: AttentionRecord | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """``x`` (B, n, d_model) -> (B, n, d_model). ``positions`` (B, n): rotary positions.

        ``mask``: key padding of the target, bool broadcastable to (B, 1, 1, n_cached + n);
        the layers add the causal mask [eq:att-mask]. ``memory_mask``: key padding of the source,
        broadcastable to (B, 1, 1, m).
        """
        n = x.shape[1]
        bias = None
        if self.position_bias is not None and cache is not None and cache.fixed_step:
            assert cache.clock is not None and cache.clock.slot is not None
            bias = self.position_bias.at(cache.clock.slot, cache.capacity)  # (1, H, 1, capacity)
        elif self.position_bias is not None:
            past = len(cache) if cache is not None else 0
            bias = self.position_bias(n, past + n, offset=past)  # (1, H, n, past + n)
        for i, layer in enumerate(self.layers):
            x = layer(
                x,
                memory,
                mask=mask,
                memory_mask=memory_mask,
                position_bias=bias,
                self_cache=cache.self_attn[i] if cache is not None else None,
                cross_cache=cache.cross_attn[i] if cache is not None else None,
                record=record,
                positions=positions,
            )
        return x if self.final_norm is None else self.final_norm(x)
