"""Position information (chapter §Positional Encoding).

Attention alone is permutation equivariant, so order must be injected: the chapter's
sinusoidal encoding, learned absolute embeddings (BERT, GPT-2), T5's relative position
bias, and rotary embeddings.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

Layout = Literal["interleaved", "halves"]


def _inverse_wavelengths(d: int, base: float) -> Tensor:
    """1 / base^(2i/d) for i = 0 .. d/2 - 1, in float64 for exactness, on the CPU whatever the
    default device (on "meta", where models are built to check a file's shapes, arange runs
    Python refs that import torch._dynamo: 1.2 s of a load)."""
    two_i = torch.arange(0, d, 2, dtype=torch.float64, device="cpu")
    return torch.exp(-math.log(base) * two_i / d)


def sinusoidal_table(
    n_positions: int,
    d_model: int,
    base: float = 10000.0,
    layout: Layout = "interleaved",
    offset: int = 0,
) -> Tensor:
    """The sinusoidal encoding of positions ``offset .. offset + n_positions - 1``.

    Implements [eq:att-pe-sin] PE(pos, 2i) = sin(pos / 10000^(2i/d_model)) and
    [eq:att-pe-cos] PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).

    ``layout="interleaved"`` is the chapter's (sin and cos alternate); ``"halves"`` puts all
    sines first, then all cosines (Marian, fairseq): a permutation of the same numbers.
    Returns ``(n_positions, d_model)`` float32, computed in float64 on the CPU.
    """
    if d_model <= 0 or d_model % 2:
        raise ValueError(f"sinusoidal encodings need an even d_model > 0, got {d_model}")
    if layout not in ("interleaved", "halves"):
        raise ValueError(f"layout must be 'interleaved' or 'halves', got {layout!r}")
    pos = torch.arange(offset, offset + n_positions, dtype=torch.float64, device="cpu")[:, None]  # (T, 1)
    angles = pos * _inverse_wavelengths(d_model, base)  # (T, 1) * (d/2,) -> (T, d/2)
    if layout == "halves":
        table = torch.cat([angles.sin(), angles.cos()], dim=-1)  # (T, d/2) x2 -> (T, d)
    else:
        table = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)  # (T, d/2, 2) -> (T, d)
    return table.float()


class SinusoidalPositionalEncoding(nn.Module):
    """Fixed sinusoidal positions [eq:att-pe-sin][eq:att-pe-cos]; no parameters, any length.

    ``forward(T, offset)`` returns the ``(T, d_model)`` encodings of positions
    ``offset .. offset + T - 1``, to be added to the token embeddings.
    """

    def __init__(self, d_model: int, base: float = 10000.0, layout: Layout = "interleaved") -> None:
        super().__init__()
        sinusoidal_table(1, d_model, base, layout)  # validates the arguments
        self.d_model, self.base, self.layout = d_model, base, layout
        table = sinusoidal_table(512, d_model, base, layout).to(torch.get_default_device())
        self.register_buffer("table", table, persistent=False)

    def _grow(self, end: int) -> None:
        if end > self.table.shape[0]:  # grow geometrically; positions never run out
            size = max(end, 2 * self.table.shape[0])
            self.table = sinusoidal_table(size, self.d_model, self.base, self.layout).to(self.table)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        self._grow(offset + length)
        return self.table[offset : offset + length]

    def cover(self, end: int) -> None:
        """Make positions 0 .. end - 1 available (before a compiled step, which cannot grow the table)."""
        self._grow(end)

    def at(self, position_ids: Tensor) -> Tensor:
        """Encodings at arbitrary positions: ``(B, T)`` ids -> ``(B, T, d_model)``."""
        if not torch.compiler.is_compiling():  # a compiled step's positions are covered first
            self._grow(int(position_ids.max()) + 1)
        return self.table[position_ids]


class LearnedPositionalEmbedding(nn.Module):
    """Learned absolute position embeddings (BERT, GPT-2): a ``(max_len, d_model)`` table."""

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        if max_len <= 0 or d_model <= 0:
            raise ValueError(f"max_len ({max_len}) and d_model ({d_model}) must be positive")
        self.max_len = max_len
        self.weight = nn.Parameter(torch.empty(max_len, d_model))
        nn.init.normal_(self.weight, std=0.02)

    def _check(self, end: int) -> None:
        if end > self.max_len:
            raise ValueError(
                f"sequence of length {end} exceeds max_len={self.max_len} of learned positions; "
                "use a shorter input or a model with sinusoidal or relative positions"
            )

    def forward(self, length: int, offset: int = 0) -> Tensor:
        self._check(offset + length)
        return self.weight[offset : offset + length]

    def cover(self, end: int) -> None:
        """Refuse positions beyond the table before a compiled step (which does not check them)."""
        self._check(end)

    def at(self, position_ids: Tensor) -> Tensor:
        """Embeddings at arbitrary positions: ``(B, T)`` ids -> ``(B, T, d_model)``."""
        if not torch.compiler.is_compiling():  # a compiled step's positions are covered first
            self._check(int(position_ids.max()) + 1)
        return self.weight[position_ids]


def relative_position_bucket(
    relative_position: Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> Tensor:
    """T5's bucketing of ``key_position - query_position``.

    Half the buckets (per direction when bidirectional) hold exact small distances; the rest
    cover distances up to ``max_distance`` logarithmically; farther ones share the last bucket.
    """
    buckets = torch.zeros_like(relative_position)
    n = -relative_position  # > 0: the key is in the past
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (n < 0).long() * num_buckets
        n = n.abs()
    else:
        n = n.clamp(min=0)
    max_exact = num_buckets // 2
    log_ratio = torch.log(n.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(n < max_exact, n, large)


class RelativePositionBias(nn.Module):
    """T5's learned relative position bias: one scalar per (bucket, head), added to the scores.

    ``forward(n, m, offset)`` returns ``(1, H, n, m)`` for queries at positions
    ``offset .. offset + n - 1`` against keys ``0 .. m - 1``. Encoder stacks are
    ``bidirectional``; decoders only look back.
    """

    def __init__(
        self, n_heads: int, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True
    ) -> None:
        super().__init__()
        # The exact buckets cover distances below max_exact (a quarter of the buckets when
        # bidirectional, half otherwise); the logarithmic ones need max_distance beyond it.
        max_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
        if num_buckets < 4 or max_distance <= max_exact:
            raise ValueError(
                f"need num_buckets >= 4 and max_distance > {max_exact} (the exact-distance buckets), "
                f"got num_buckets={num_buckets}, max_distance={max_distance}"
            )
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.embedding = nn.Embedding(num_buckets, n_heads)

    def forward(self, n: int, m: int, offset: int = 0) -> Tensor:
        return self.at(torch.arange(offset, offset + n, device=self.embedding.weight.device), m)

    def at(self, query: Tensor, m: int) -> Tensor:
        """The bias of queries at positions ``query`` (n,) against keys ``0 .. m - 1``: (1, H, n, m)."""
        key = torch.arange(m, device=query.device)[None, :]  # (1, m)
        buckets = relative_position_bucket(
            key - query[:, None], self.bidirectional, self.num_buckets, self.max_distance
        )
        return self.embedding(buckets).permute(2, 0, 1)[None]  # (n, m, H) -> (1, H, n, m)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoFormer): rotate each pair of a query or key's components
    by pos·θ_i with θ_i = base^(-2i/d), the same angles as [eq:att-pe-sin].

    By the rotation argument of [prop:att-pe-linear], ⟨R(p)q, R(p')k⟩ depends only on p' - p.
    ``layout``: which components pair up: ``"interleaved"`` (2i, 2i+1), RoFormer's and the
    chapter's sin/cos order; ``"halves"`` (i, i + d/2), Llama's ``rotate_half``.
    """

    def __init__(self, dim: int, base: float = 10000.0, layout: str = "interleaved") -> None:
        super().__init__()
        if dim <= 0 or dim % 2:
            raise ValueError(f"rotary embeddings need an even dim > 0, got {dim}")
        if layout not in ("interleaved", "halves"):
            raise ValueError(f"rotary layout must be 'interleaved' or 'halves', got {layout!r}")
        self.dim, self.layout = dim, layout
        inv_freq = _inverse_wavelengths(dim, base).float().to(torch.get_default_device())
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """``x`` (B, H, T, dim) at positions offset .. offset + T - 1, or at ``positions``
        (B, T) when given (left-padded rows count from their first real token) -> rotated."""
        T = x.shape[-2]
        if positions is None:
            pos = torch.arange(offset, offset + T, device=x.device, dtype=torch.float32)  # (T,)
        else:
            pos = positions.to(torch.float32)[:, None]  # (B, T) -> (B, 1, T): one row of angles per batch row
        angles = pos[..., None] * self.inv_freq  # (..., T, dim/2)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        if self.layout == "halves":
            first, second = x.chunk(2, dim=-1)  # (..., T, dim/2) each
            return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)
        pairs = x.unflatten(-1, (-1, 2))  # (..., T, dim) -> (..., T, dim/2, 2)
        even, odd = pairs[..., 0], pairs[..., 1]
        rotated = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)
        return rotated.flatten(-2)  # (..., T, dim/2, 2) -> (..., T, dim)
