"""Attention masks. One convention everywhere: ``bool``, ``True`` = may attend.

The chapter writes the mask additively (0 or -inf, [eq:att-mask]); attnkit keeps it
boolean from collation to the attention kernel and converts it once, inside
:func:`attnkit.nn.attention.scaled_dot_product_attention`.
"""

from __future__ import annotations

import torch
from torch import Tensor


def causal_mask(n: int, m: int | None = None, *, device: torch.device | str | None = None) -> Tensor:
    """The causal mask of [eq:att-mask] as booleans: query ``i`` may attend key ``j`` iff ``j <= i``.

    With ``m > n`` keys (incremental decoding: ``m - n`` positions are already cached) the
    ``n`` queries are the *last* ``n`` positions, so query ``i`` sits at absolute position
    ``i + m - n`` and may attend keys ``j <= i + m - n``.

    Returns a ``(n, m)`` bool tensor; ``True`` where [eq:att-mask] has 0, ``False`` where it
    has -inf.
    """
    m = n if m is None else m
    if n < 0 or m < n:
        raise ValueError(f"causal_mask needs 0 <= n <= m, got n={n}, m={m}; m counts the cached plus the new positions")
    return torch.ones(n, m, dtype=torch.bool, device=device).tril(diagonal=m - n)


def lengths_to_mask(lengths: Tensor, max_len: int | None = None) -> Tensor:
    """``(B,)`` sequence lengths -> ``(B, T)`` bool, ``True`` at real (non-padding) tokens."""
    if lengths.dim() != 1 or lengths.dtype.is_floating_point:
        raise ValueError(
            f"lengths must be a 1-D integer tensor, got shape {tuple(lengths.shape)} and dtype {lengths.dtype}"
        )
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError(f"lengths must be >= 0, got min {int(lengths.min())}")
    longest = int(lengths.max()) if lengths.numel() else 0
    max_len = longest if max_len is None else max_len
    if max_len < longest:
        raise ValueError(f"max_len={max_len} is shorter than the longest length {longest}")
    return torch.arange(max_len, device=lengths.device) < lengths[:, None]


def padding_mask(attention_mask: Tensor) -> Tensor:
    """Key-padding mask from the ecosystem's ``attention_mask`` (``(B, T)``, 1/True = real token).

    Returns ``(B, 1, 1, T)`` bool, broadcastable against ``(B, H, T_q, T)`` scores.
    """
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must have shape (batch, seq_len), got {tuple(attention_mask.shape)}")
    if attention_mask.dtype != torch.bool:
        if attention_mask.dtype.is_floating_point or attention_mask.dtype.is_complex:
            raise ValueError(
                f"attention_mask must hold 0/1 integers or booleans, got dtype "
                f"{attention_mask.dtype}; pass attention_mask.long()"
            )
        bad = (attention_mask != 0) & (attention_mask != 1)
        if bool(bad.any()):
            raise ValueError(
                f"attention_mask must hold only 0 (padding) and 1 (real token), got value {int(attention_mask[bad][0])}"
            )
        attention_mask = attention_mask.bool()
    return attention_mask[:, None, None, :]  # (B, T) -> (B, 1, 1, T)
