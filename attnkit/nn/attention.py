"""Scaled dot-product attention and multi-head attention (chapter §Scaled Dot-Product
Attention, §Multi-Head Attention).

Two paths compute [eq:att-sdpa]: :func:`attention_math` spells the equation out and can
return the weights [eq:att-alpha]; :func:`attention_fused` calls
``torch.nn.functional.scaled_dot_product_attention``. :func:`scaled_dot_product_attention`
picks the fused one unless the weights are asked for; a test holds the two equal.
"""

from __future__ import annotations

import contextlib
import math
from typing import Literal, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnkit.nn.cache import BeamKVCache, KVCache
from attnkit.nn.masks import causal_mask
from attnkit.nn.positional import RotaryEmbedding
from attnkit.nn.quantized import products


def _check_inputs(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    bias: Tensor | None,
    scale: float | None,
    dropout_p: float,
) -> None:
    """Validate shapes and dtypes before any kernel runs (``ValueError``, never ``assert``)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() < 2:
            raise ValueError(f"{name} must have shape (..., seq_len, dim), got {tuple(t.shape)}")
        if not t.dtype.is_floating_point:
            raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(
            "q, k and v must share their leading (batch, head) dimensions, got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same last dimension d_k, got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of positions m, got {k.shape[-2]} and {v.shape[-2]}")
    if k.shape[-2] == 0:
        raise ValueError("attention needs at least one key position, got m=0")
    scores_shape = (*q.shape[:-1], k.shape[-2])
    for name, t in (("mask", mask), ("bias", bias)):
        if t is None:
            continue
        if name == "mask" and t.dtype != torch.bool:
            raise ValueError(
                f"mask must be a bool tensor (True = may attend), got dtype {t.dtype}; "
                "convert with mask.bool() or build it with attnkit.nn.masks"
            )
        if name == "bias" and not t.dtype.is_floating_point:
            raise ValueError(f"bias must be a floating-point tensor, got dtype {t.dtype}")
        # Each trailing dim 1 or the scores' own (torch.broadcast_shapes imports the symbolic
        # shapes of torch.fx at its first call: 0.4 s of a server's first answer).
        trailing = zip(reversed(t.shape), reversed(scores_shape), strict=False)
        if t.dim() > len(scores_shape) or any(a not in (1, b) for a, b in trailing):
            raise ValueError(
                f"{name} of shape {tuple(t.shape)} does not broadcast to the scores' shape "
                f"{scores_shape} (..., n queries, m keys)"
            )
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number, got {scale}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")


def _with_causal(mask: Tensor | None, q: Tensor, k: Tensor) -> Tensor:
    """``mask`` AND the causal mask [eq:att-mask] of n queries that are the last of m positions."""
    causal = causal_mask(q.shape[-2], k.shape[-2], device=q.device)
    return causal if mask is None else causal & mask


def _rows_with_a_key(mask: Tensor) -> Tensor:
    """``(..., n, 1)`` bool: which query rows may attend at least one key."""
    return mask.any(dim=-1, keepdim=True)


def attention_math(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    bias: Tensor | None = None,
    is_causal: bool = False,
) -> tuple[Tensor, Tensor]:
    """The readable path of [eq:att-sdpa]; returns ``(output, weights)``.

    Implements [eq:att-sdpa] softmax(Q Kᵀ/√d_k + M) V with the weights of [eq:att-alpha] and
    the masked form [eq:att-masked]. The -inf of [eq:att-mask] is the dtype's most negative
    finite number, so masked weights are exactly 0 after the softmax and a query row with
    no key to attend (all padding) gives a zero output row and finite gradients, where -inf
    would give NaN.

    Shapes: q (..., n, d_k), k (..., m, d_k), v (..., m, d_v); mask (bool, True = may
    attend) and bias (additive, e.g. T5's relative positions) broadcastable to (..., n, m).
    Returns output (..., n, d_v) and weights (..., n, m).

    The default scale 1/√d_k is [prop:att-variance]: for unit-variance independent q, k
    components q·k has variance d_k [eq:att-variance], so q·k/√d_k has unit variance and the
    softmax stays out of saturation whatever the head width.
    """
    _check_inputs(q, k, v, mask, bias, scale, dropout_p)
    return _math(q, k, v, mask, scale, dropout_p, bias, is_causal)


def _math(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    scale: float | None,
    dropout_p: float,
    bias: Tensor | None,
    is_causal: bool,
) -> tuple[Tensor, Tensor]:
    """:func:`attention_math` on inputs already checked."""
    if is_causal and q.shape[-2] > 1:  # one query, the last position, sees every key
        mask = _with_causal(mask, q, k)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale  # (..., n, d_k) @ (..., d_k, m) -> (..., n, m)
    if bias is not None:
        scores = scores + bias
    keep = None
    if mask is not None:
        keep = _rows_with_a_key(mask)
        scores = scores.masked_fill(~(mask | ~keep), torch.finfo(scores.dtype).min)
    # rows sum to 1 [eq:att-alpha]; half-precision scores are normalised in float32
    low_precision = scores.dtype in (torch.float16, torch.bfloat16)
    weights = torch.softmax(scores.float() if low_precision else scores, dim=-1).to(v.dtype)
    if keep is not None:
        weights = weights * keep  # a row with no key attends nothing
    attended = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    return torch.matmul(attended, v), weights  # (..., n, m) @ (..., m, d_v) -> (..., n, d_v)


# On the CPU, the fused (flash) kernel's backward is about twice as slow as the math kernel's
# while the score matrix is small (measured here: 6.7 vs 3.1 ms for 48 × 4 heads × 32², 8.9 vs
# 5.7 ms at 128²; flash wins from 256²), and its forward is faster at any size. So a step that
# will be differentiated through small scores runs the math kernel; inference keeps flash.
_SMALL_SCORES = 128 * 128


# One query against a short history (a decoding step) is the other way round: SDPA's CPU
# kernels are slower than two matmuls there (measured here for 128 rows x 8 heads x 1 query
# x 33 keys of 64: flash 430 us in fp32 and 2,272 us in bf16, the math backend 355 and 7,253,
# two matmuls 222 and 343; for 1 row x 80 keys flash wins, 12 vs 22 us). So a forward pass of
# few queries over many rows, outside autograd, runs the matmuls of the readable path.
_FEW_QUERIES, _MANY_ROWS = 4, 16


def _matmuls_win(q: Tensor) -> bool:
    if q.shape[-2] > _FEW_QUERIES or torch.is_grad_enabled():
        return False
    if torch.compiler.is_compiling():  # a compiled decoding step: inductor fuses the readable path
        return True
    rows = q.numel() // (q.shape[-1] * q.shape[-2])  # batch x heads
    return q.device.type == "cpu" and rows >= _MANY_ROWS


def _kernel(q: Tensor, k: Tensor) -> contextlib.AbstractContextManager:
    """The SDPA backends to allow for this call (see ``_SMALL_SCORES``)."""
    small = q.shape[-2] * k.shape[-2] <= _SMALL_SCORES
    if small and q.device.type == "cpu" and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
        return sdpa_kernel([SDPBackend.MATH])
    return contextlib.nullcontext()


def attention_fused(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    bias: Tensor | None = None,
    is_causal: bool = False,
) -> Tensor:
    """The fast path of [eq:att-sdpa] through ``torch.nn.functional.scaled_dot_product_attention``.

    Same contract as :func:`attention_math` (without the weights): rows with no key to
    attend are given every key inside the kernel, then zeroed, so they stay finite. A plain
    causal self-attention (no other mask, no bias) runs the kernel's own causal mode. A
    decoding step (few queries, many rows, no autograd) runs the matmuls of
    :func:`attention_math` instead, which are faster there (``_FEW_QUERIES``).
    """
    _check_inputs(q, k, v, mask, bias, scale, dropout_p)
    if _matmuls_win(q) and dropout_p == 0.0:
        return _math(q, k, v, mask, scale, dropout_p, bias, is_causal)[0]
    if is_causal and mask is None and bias is None and q.shape[-2] == k.shape[-2]:
        with _kernel(q, k):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale, is_causal=True)
    if is_causal:
        mask = _with_causal(mask, q, k)
    keep = None
    attn_mask: Tensor | None = mask
    if mask is not None:
        keep = _rows_with_a_key(mask)
        if bool(keep.all()):  # the usual case: no extra work on the output
            keep = None
        else:
            attn_mask = mask | ~keep
    if bias is not None:
        bias = bias.to(q.dtype)
        attn_mask = bias if attn_mask is None else bias.masked_fill(~attn_mask, float("-inf"))
    with _kernel(q, k):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale)
    return out if keep is None else out * keep


@overload
def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = ...,
    scale: float | None = ...,
    dropout_p: float = ...,
    return_weights: Literal[False] = ...,
    bias: Tensor | None = ...,
    is_causal: bool = ...,
) -> Tensor: ...
@overload
def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = ...,
    scale: float | None = ...,
    dropout_p: float = ...,
    return_weights: Literal[True] = ...,
    bias: Tensor | None = ...,
    is_causal: bool = ...,
) -> tuple[Tensor, Tensor]: ...
def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    bias: Tensor | None = None,
    is_causal: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Scaled dot-product attention, [def:att-sdpa].

    Implements [eq:att-sdpa] softmax(Q Kᵀ / √d_k) V, with [eq:att-alpha] as the weights
    and [eq:att-masked] when a mask is given.

    Shapes: q (..., n, d_k), k (..., m, d_k), v (..., m, d_v); ``mask`` broadcastable to
    (..., n, m), bool, True = may attend; ``bias`` an additive float term of the same
    broadcast shape; ``is_causal`` adds the causal mask [eq:att-mask] (the n queries being the
    last n of the m positions). ``scale`` defaults to 1/√d_k (T5 passes 1.0: its initialisation absorbs
    the factor). With ``return_weights`` the math path runs and ``(output, weights)`` is
    returned; otherwise the fused kernel runs and the output alone is returned.
    """
    if return_weights:
        return attention_math(q, k, v, mask, scale, dropout_p, bias, is_causal)
    return attention_fused(q, k, v, mask, scale, dropout_p, bias, is_causal)


class MultiHeadAttention(nn.Module):
    """Multi-head attention, [eq:att-head] and [eq:att-multihead].

    ``w_q``, ``w_k`` (d_model -> h·d_k) and ``w_v`` (d_model -> h·d_v) hold the h heads'
    projections W_i^Q, W_i^K, W_i^V side by side; ``w_o`` (h·d_v -> d_model) is W^O.
    Self-attention when ``memory`` is None, cross-attention on ``memory`` otherwise.

    Variants: ``bias=False`` (T5), ``scale_scores=False`` drops 1/√d_k (T5, whose
    initialisation absorbs it), ``rotary`` rotates queries and keys (RoFormer, Llama),
    ``n_kv_heads`` < h shares each key/value head among h / n_kv_heads query heads
    (grouped-query attention, Llama; 1 = multi-query): ``w_k``, ``w_v`` and the cache hold
    only the n_kv_heads heads.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_k: int | None = None,
        d_v: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        scale_scores: bool = True,
        rotary: RotaryEmbedding | None = None,
        n_kv_heads: int | None = None,
    ) -> None:
        super().__init__()
        if d_model <= 0 or n_heads <= 0:
            raise ValueError(f"d_model ({d_model}) and n_heads ({n_heads}) must be positive")
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_kv_heads <= 0 or n_heads % n_kv_heads:
            raise ValueError(
                f"n_kv_heads ({n_kv_heads}) must divide n_heads ({n_heads}): each key/value head serves a whole "
                "group of query heads"
            )
        if d_k is None or d_v is None:
            if d_model % n_heads:
                raise ValueError(
                    f"d_model ({d_model}) must be divisible by n_heads ({n_heads}); "
                    "choose n_heads among its divisors or pass d_k and d_v explicitly"
                )
            d_k = d_model // n_heads if d_k is None else d_k
            d_v = d_model // n_heads if d_v is None else d_v
        if d_k <= 0 or d_v <= 0:
            raise ValueError(f"d_k ({d_k}) and d_v ({d_v}) must be positive")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if rotary is not None and rotary.dim != d_k:
            raise ValueError(f"rotary dim ({rotary.dim}) must equal d_k ({d_k})")
        self.d_model, self.n_heads, self.d_k, self.d_v = d_model, n_heads, d_k, d_v
        self.n_kv_heads = n_kv_heads
        self.dropout = dropout
        self.scale = 1.0 / math.sqrt(d_k) if scale_scores else 1.0
        self.w_q = nn.Linear(d_model, n_heads * d_k, bias=bias)
        self.w_k = nn.Linear(d_model, n_kv_heads * d_k, bias=bias)
        self.w_v = nn.Linear(d_model, n_kv_heads * d_v, bias=bias)
        self.w_o = nn.Linear(n_heads * d_v, d_model, bias=bias)
        self.rotary = rotary

    def _split(self, x: Tensor, d: int) -> Tensor:
        B, T, width = x.shape
        return x.view(B, T, width // d, d).transpose(1, 2)  # (B, T, H·d) -> (B, H, T, d)

    # [eq:att-multihead] for self and cross attention, with and without a cache, in one place:
    # each branch is one of those cases, and splitting them would copy the projections.
    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
        position_bias: Tensor | None = None,
        cache: KVCache | BeamKVCache | None = None,
        return_weights: bool = False,
        is_causal: bool = False,
        positions: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x`` (B, n, d_model) to itself or to ``memory`` (B, m, d_model).

        ``mask``: bool, broadcastable to (B, H, n, m), True = may attend. ``position_bias``:
        additive (1 or B, H, n, m). ``is_causal``: also apply the causal mask [eq:att-mask].
        ``cache``: a :class:`KVCache`; self-attention appends the new keys/values to it, a
        ``static`` cache (cross-attention) is filled from ``memory`` on the first call and
        reused afterwards. ``positions`` (B, n): where the rotary positions of the new
        queries and keys are (default: after the cached ones). Returns the output
        (B, n, d_model) and, when ``return_weights``, the per-head weights (B, H, n, m).
        """
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (batch, seq_len, {self.d_model}), got {tuple(x.shape)}")
        if memory is not None and (memory.dim() != 3 or memory.shape[-1] != self.d_model):
            raise ValueError(f"memory must have shape (batch, src_len, {self.d_model}), got {tuple(memory.shape)}")
        if memory is not None and x.shape[0] % memory.shape[0]:
            raise ValueError(
                f"x has {x.shape[0]} rows and memory {memory.shape[0]}: each memory row serves a whole "
                "number of consecutive rows of x (its beams); pass as many memory rows as x rows or a divisor"
            )
        B, n, _ = x.shape
        cross = cache is not None and cache.static  # cross-attention, memory passed at its first step only
        if memory is None and not cross:  # self-attention: q, k and v of one input, one product where it can
            q, k, v = products(x, (self.w_q, self.w_k, self.w_v))
            k, v = self._split(k, self.d_k), self._split(v, self.d_v)  # (B, n, d_model) -> (B, H, n, d)
        else:
            q = self.w_q(x)
        q = self._split(q, self.d_k)  # (B, n, d_model) -> (B, H, n, d_k)
        if cross and cache.k is not None:
            k, v = cache.k, cache.v  # cross-attention: the memory's keys/values, computed once
        else:
            if memory is not None:
                k = self._split(self.w_k(memory), self.d_k)  # (B, m, d_model) -> (B, H, m, d_k)
                v = self._split(self.w_v(memory), self.d_v)  # (B, m, d_model) -> (B, H, m, d_v)
            if self.rotary is not None and memory is None:
                offset = len(cache) if cache is not None else 0
                q, k = self.rotary(q, offset, positions), self.rotary(k, offset, positions)
            if cache is not None:
                step = n == 1 and not cache.static and not return_weights and _matmuls_win(q)  # see KVCache.whole
                k, v, mask, position_bias = cache.attend(k, v, mask, position_bias, whole=step)
                if n == 1:  # one new position attends every cached one: the masks above say which
                    is_causal = False
        if self.n_kv_heads != self.n_heads:  # (B, H_kv, m, d) -> (B, H, m, d): query head h reads kv head h // g
            group = self.n_heads // self.n_kv_heads
            k = k[:, :, None].expand(-1, -1, group, -1, -1).flatten(1, 2)
            v = v[:, :, None].expand(-1, -1, group, -1, -1).flatten(1, 2)
        # The g = B / B_m rows of x that share a memory row (an example's beams) attend to it as
        # g·n queries of one row: its keys and values are computed and read once, not g times.
        g = B // k.shape[0]
        if g > 1:  # (B, H, n, d_k) -> (B_m, H, g·n, d_k)
            q = q.reshape(-1, g, self.n_heads, n, self.d_k).transpose(1, 2).reshape(-1, self.n_heads, g * n, self.d_k)
        dropout_p = self.dropout if self.training else 0.0
        weights = None
        if return_weights:
            heads, weights = attention_math(q, k, v, mask, self.scale, dropout_p, position_bias, is_causal)
            weights = _ungroup(weights, g)  # (B, H, n, m)
        else:
            heads = attention_fused(q, k, v, mask, self.scale, dropout_p, position_bias, is_causal)
        # (B, H, n, d_v) -> (B, n, H·d_v)
        concat = _ungroup(heads, g).transpose(1, 2).reshape(B, n, self.n_heads * self.d_v)
        return self.w_o(concat), weights


def _ungroup(t: Tensor, g: int) -> Tensor:
    """(B_m, H, g·n, d) -> (B_m·g, H, n, d): the g query groups back to their own rows."""
    if g == 1:
        return t
    B_m, H, gn, d = t.shape
    return t.reshape(B_m, H, g, gn // g, d).transpose(1, 2).reshape(B_m * g, H, gn // g, d)
