"""Key/value cache for incremental decoding: the chapter's greedy loop without recomputing the
prefix.

At step t the decoder needs the keys and values of every earlier position; they do not
change once computed (the causal mask [eq:att-mask] keeps the past blind to the future), so
each self-attention layer appends its new ones and each cross-attention layer computes the
memory's once.
"""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Keys and values of one attention module, each ``(B, H, T, d)``.

    ``static=False`` (self-attention): :meth:`update` appends along time.
    ``static=True`` (cross-attention): the first :meth:`update` stores the memory's keys and
    values; :class:`~attnkit.nn.attention.MultiHeadAttention` reuses them afterwards.
    """

    def __init__(self, static: bool = False) -> None:
        self.static = static
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the new ``k``, ``v`` (B, H, t, d); return all cached keys and values."""
        if self.k is None or self.static:
            self.k, self.v = k, v
        else:
            self.k = torch.cat([self.k, k], dim=-2)  # (B, H, T, d) + (B, H, t, d) -> (B, H, T+t, d)
            self.v = torch.cat([self.v, v], dim=-2)
        return self.k, self.v

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search re-ranking its hypotheses)."""
        if self.k is not None:
            self.k = self.k.index_select(0, index)
            self.v = self.v.index_select(0, index)


class DecoderCache:
    """The caches of a decoder stack: one self-attention and (optionally) one cross-attention
    :class:`KVCache` per layer."""

    def __init__(self, n_layers: int, cross_attention: bool) -> None:
        self.self_attn = [KVCache() for _ in range(n_layers)]
        self.cross_attn: list[KVCache | None] = [
            KVCache(static=True) if cross_attention else None for _ in range(n_layers)
        ]

    def __len__(self) -> int:
        """Number of target positions already processed."""
        return len(self.self_attn[0]) if self.self_attn else 0

    def reorder(self, index: Tensor, cross_attention: bool = True) -> None:
        """Keep batch rows ``index``. ``cross_attention=False`` leaves the memory's keys and
        values alone: right when ``index`` only permutes rows that share a source (beams)."""
        caches = (*self.self_attn, *self.cross_attn) if cross_attention else self.self_attn
        for cache in caches:
            if cache is not None:
                cache.reorder(index)
