"""Weights in blocks of 32 along their inputs, as llama.cpp stores them (its GGUF types of the same
names), in pure PyTorch: quantisation, dequantisation, and the reference of the C kernel's
arithmetic.

Each format holds, for a weight (n, k) with k a multiple of 32, its values ``data`` and one fp16
scale ``d`` per block (n, k / 32):

* ``q8_0``: ``w = q · d``, ``q`` int8 (n, k), ``d = max|w| / 127``;
* ``q4_0``: ``w = (u - 8) · d``, ``u`` in 0..15 packed two to a byte (n, k / 2), ``d = w* / -8``
  where ``w*`` is the block's value of largest magnitude (it maps to -8 exactly);
* ``q4_1``: ``w = u · d + m``, ``u`` as ``q4_0``'s, ``d`` and the offset ``m`` (GGUF's "min"; fp16,
  n, k / 32) the block's grid of least squared error found (:func:`_fit_q4_1`), where llama.cpp's
  reference takes ``d = (max - min) / 15`` and ``m = min``.

A 4-bit block's byte i holds ``u_i`` in its low nibble and ``u_{i+16}`` in its high one, GGUF's
order, so a GGUF file's blocks are used as they are. The activations meet them quantised per block
of 32 with an fp32 scale (:func:`quantize_activations`): to int8 for the 4-bit formats, to int16
for q8_0 (``LEVELS``), whose int8 weights meet those at the cost of int8 activations in the C
kernel, 256 times finer: int8 activations flipped near-ties of fp32's greedy choice.
"""

from __future__ import annotations

import torch
from torch import Tensor

BLOCK = 32
FORMATS = ("q8_0", "q4_0", "q4_1")
BITS = {"q8_0": 8, "q4_0": 4, "q4_1": 4}
LEVELS = {"q8_0": 32767, "q4_0": 127, "q4_1": 127}  # the activations' largest integer, per weight format


def check(format: str) -> None:
    if format not in FORMATS:
        raise ValueError(f"format={format!r} is not a block format; use one of {', '.join(FORMATS)}")


def _blocks(x: Tensor) -> Tensor:
    """(n, k) -> (n, k / 32, 32) fp32; k must be a multiple of 32."""
    if x.dim() != 2 or x.shape[1] % BLOCK:
        raise ValueError(f"a tensor of shape {tuple(x.shape)} is not (n, k) with k a multiple of {BLOCK}; pad k")
    return x.float().reshape(x.shape[0], x.shape[1] // BLOCK, BLOCK)  # sizes given: n or k may be 0


def quantize_activations(x: Tensor, levels: int = 127) -> tuple[Tensor, Tensor]:
    """``x`` (m, k) -> its integer values (m, k), int8 for ``levels`` 127 and int16 for 32767, and
    fp32 block scales (m, k / 32), ``x ≈ q · scale`` per block: ``q = round(x · levels / max|block|)``
    (half to even), as the C kernel quantises."""
    if levels not in (127, 32767):
        raise ValueError(f"levels={levels} is not 127 (int8) or 32767 (int16)")
    blocks = _blocks(x)
    peak = blocks.abs().amax(dim=-1, keepdim=True)  # (m, k / 32, 1)
    inverse = torch.where(peak > 0, levels / peak, torch.zeros_like(peak))
    q = torch.round(blocks * inverse).clamp_(-levels, levels)
    dtype = torch.int8 if levels == 127 else torch.int16
    return q.reshape(x.shape).to(dtype), (peak / levels).squeeze(-1)


def _pack(u: Tensor) -> Tensor:
    """(n, k / 32, 32) values in 0..15 -> (n, k / 2) uint8, GGUF's nibble order."""
    u = u.to(torch.uint8)
    return (u[..., :16] | (u[..., 16:] << 4)).reshape(u.shape[0], u.shape[1] * BLOCK // 2)


def _unpack(data: Tensor) -> Tensor:
    """(n, k / 2) uint8 -> (n, k / 32, 32) values in 0..15."""
    packed = data.reshape(data.shape[0], data.shape[1] * 2 // BLOCK, BLOCK // 2)
    return torch.cat([packed & 0x0F, packed >> 4], dim=-1)


def quantize(weight: Tensor, format: str) -> tuple[Tensor, Tensor, Tensor | None]:
    """``weight`` (n, k), k a multiple of 32 -> ``(data, d, m)`` in ``format`` (module docstring);
    ``m`` is None except for q4_1. The values are rounded against the fp16 scales they are
    stored with."""
    check(format)
    w = _blocks(weight.detach())  # (n, b, 32)
    if format == "q8_0":
        d = (w.abs().amax(-1) / 127).half()  # (n, b)
        inverse = torch.where(d > 0, 1 / d.float(), torch.zeros_like(d, dtype=torch.float32))
        q = torch.round(w * inverse[..., None]).clamp_(-127, 127).to(torch.int8)
        return q.reshape(weight.shape), d, None
    if format == "q4_0":
        extreme = w.gather(-1, w.abs().argmax(-1, keepdim=True)).squeeze(-1)  # signed, (n, b)
        d = (extreme / -8).half()
        inverse = torch.where(d != 0, 1 / d.float(), torch.zeros_like(d, dtype=torch.float32))
        return _pack((torch.round(w * inverse[..., None]) + 8).clamp_(0, 15)), d, None
    u, d, m = _fit_q4_1(w)
    return _pack(u), d, m


def _round_q4_1(w: Tensor, d: Tensor, m: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Blocks ``w`` (N, 32) on the grids ``u · d + m`` (d, m (N,), rounded to fp16 as stored): the
    values ``u`` in 0..15, ``d`` and ``m`` in fp16, and each block's squared error (N,)."""
    d, m = d.half(), m.half()
    inverse = torch.where(d > 0, 1 / d.float(), torch.zeros_like(d, dtype=torch.float32))
    u = torch.round((w - m.float()[:, None]) * inverse[:, None]).clamp_(0, 15)
    error = (u * d.float()[:, None] + m.float()[:, None] - w).square_().sum(-1)
    return u, d, m, error


# The stretches t of a block's grid searched: 11 give 10.5% less RMS error than min-max on Gaussian
# weights, 21 (llama.cpp's K-quants') 10.7% at 1.6 times the time.
SEARCH = torch.linspace(-1, 1, 11).tolist()
_FIT_BLOCKS = 4096  # blocks fitted at a time: 512 KiB of fp32 (3072 x 768: 0.06 s, 2x that in one piece)


def _fit_q4_1(w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Each block's Q4_1 values, scale and offset ((n, b, 32), (n, b), (n, b)) with the least
    squared error found: for each stretch t in ``SEARCH``, the values that a grid of ``15 + t``
    steps across the block's span gives, refitted to the block by least squares (scale and offset;
    llama.cpp's ``make_qkx2_quants`` searches its K-quants so, with weights); the best of them
    where it beats the block's min-max grid (llama.cpp's ``quantize_row_q4_1_ref``), else that
    grid. Never worse than min-max on any block; a block that is already a Q4_1 grid (a GGUF
    file's, dequantised) comes back as it was."""
    flat = w.reshape(-1, BLOCK)  # (N, 32)
    fits = [_fit_q4_1_blocks(flat[i : i + _FIT_BLOCKS]) for i in range(0, max(len(flat), 1), _FIT_BLOCKS)]
    u, d, m = (torch.cat(parts) for parts in zip(*fits, strict=True))
    return u.view(w.shape), d.view(w.shape[:-1]), m.view(w.shape[:-1])


def _fit_q4_1_blocks(w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`_fit_q4_1` of blocks ``w`` (N, 32). The fits are of the block less its minimum (no
    cancellation in the sums where a block sits far from 0); a candidate's error is its fit's,
    from the sums the fit takes; the best is then rounded as stored (fp16 d and m, u again) and
    kept where it beats min-max exactly."""
    low, high = w.amin(-1), w.amax(-1)  # (N,)
    span = high - low
    x = w - low[:, None]  # (N, 32), in [0, span]
    sum_x, sum_xx = x.sum(-1), x.square().sum(-1)
    best_error = torch.full_like(span, torch.inf)
    best_d, best_m = span / 15, torch.zeros_like(span)  # of x: its offset is m - low
    for t in SEARCH:
        steps = torch.where(span > 0, (15 + t) / span, torch.zeros_like(span))
        u = torch.round(x * steps[:, None]).clamp_(0, 15)
        sum_u, sum_uu, sum_ux = u.sum(-1), u.square().sum(-1), (u * x).sum(-1)
        det = BLOCK * sum_uu - sum_u.square()  # 0 where every u is equal: no fit
        d = (BLOCK * sum_ux - sum_u * sum_x) / det
        m = (sum_uu * sum_x - sum_u * sum_ux) / det
        # Σ (u d + m - x)² expanded in the sums
        error = sum_xx + d.square() * sum_uu + BLOCK * m.square() - 2 * d * sum_ux - 2 * m * sum_x + 2 * d * m * sum_u
        better = (det > 0) & (error < best_error)
        best_d, best_m, best_error = (
            torch.where(better, d, best_d),
            torch.where(better, m, best_m),
            torch.where(better, error, best_error),
        )
    u, d, m, error = _round_q4_1(w, best_d, best_m + low)
    plain_u, plain_d, plain_m, plain_error = _round_q4_1(w, span / 15, low)
    keep = error < plain_error  # (N,)
    return torch.where(keep[:, None], u, plain_u), torch.where(keep, d, plain_d), torch.where(keep, m, plain_m)


def integers(format: str, data: Tensor) -> Tensor:
    """The blocks' integer values (n, k / 32, 32) as int16: q, u - 8, or u."""
    if format == "q8_0":
        return data.reshape(data.shape[0], data.shape[1] // BLOCK, BLOCK).to(torch.int16)
    u = _unpack(data).to(torch.int16)
    return u - 8 if format == "q4_0" else u


def dequantize(format: str, data: Tensor, d: Tensor, m: Tensor | None = None) -> Tensor:
    """The fp32 weight (n, k) the blocks stand for."""
    check(format)
    w = integers(format, data).float() * d.float()[..., None]
    if format == "q4_1":
        w = w + m.float()[..., None]
    return w.reshape(w.shape[0], w.shape[1] * BLOCK)


PACKED_ROWS = 8  # the rows a packed group interleaves


def packed_bytes(format: str) -> int:
    """The bytes :func:`pack` gives per group of 8 rows and block: their values, fp16 scales and
    (4-bit) minima."""
    check(format)
    return PACKED_ROWS * (BLOCK * BITS[format] // 8 + (2 if format == "q8_0" else 4))


def pack(format: str, data: Tensor, d: Tensor, m: Tensor | None = None) -> Tensor | None:
    """A weight's first ``n // 8`` groups of 8 rows in the C kernel's packed layout, as one uint8
    tensor; None for fewer than 8 rows or no inputs (the kernel takes those rows, and any rest,
    from the blocks as they are). A pure rearrangement, nothing requantised: the 4-byte pieces of each
    block of 8 rows (4 of a 4-bit block's 16 bytes, 8 of q8_0's 32), interleaved (group, block,
    piece, row), then the rows' scales and, 4-bit, their minima (q4_0's are ``-8 d``, exact in
    fp16), each (group, block, row)."""
    check(format)
    groups = data.shape[0] // PACKED_ROWS
    if groups == 0 or d.shape[1] == 0:  # no group of 8 rows, or no inputs: nothing to pack
        return None
    rows, blocks = groups * PACKED_ROWS, d.shape[1]
    pieces = data[:rows].contiguous().view(torch.int32).view(groups, PACKED_ROWS, blocks, -1).permute(0, 2, 3, 1)
    sides = [d] if format == "q8_0" else [d, m if format == "q4_1" else -8 * d]
    sides = [t[:rows].reshape(groups, PACKED_ROWS, blocks).transpose(1, 2) for t in sides]
    return torch.cat([t.contiguous().view(torch.uint8).flatten() for t in (pieces, *sides)])


def unpack(format: str, packed: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor | None]:
    """The blocks ``(data, d, m)`` of the rows :func:`pack` packed (8 a group) for a weight of ``k``
    inputs: its inverse, bit for bit (q4_0's minima, ``-8 d``, are dropped again)."""
    check(format)
    blocks = k // BLOCK
    groups = packed.numel() // (blocks * packed_bytes(format))
    rows, width = groups * PACKED_ROWS, BLOCK * BITS[format] // 8  # a row's bytes per block
    size = rows * blocks * width
    pieces = packed[:size].view(torch.int32).view(groups, blocks, width // 4, PACKED_ROWS).permute(0, 3, 1, 2)
    data = pieces.contiguous().view(torch.int8 if format == "q8_0" else torch.uint8).reshape(rows, blocks * width)
    sides = packed[size:].view(torch.float16).view(-1, groups, blocks, PACKED_ROWS).transpose(2, 3)
    d, *mins = (t.reshape(rows, blocks).contiguous() for t in sides)
    return data, d, mins[0] if format == "q4_1" else None


def matmul_reference(x: Tensor, format: str, data: Tensor, d: Tensor, m: Tensor | None = None) -> Tensor:
    """The C kernel's arithmetic in PyTorch: ``x`` (m, k) fp32 quantised per block
    (:func:`quantize_activations`, ``LEVELS[format]``), times the weight's blocks: (m, n) fp32. The
    integer dot products are exact (float64 holds them); their scaled sums are fp32, as the
    kernel's."""
    check(format)
    xq, xd = quantize_activations(x, LEVELS[format])
    a = xq.double().view(len(xq), -1, BLOCK)  # (m, b, 32)
    dots = torch.einsum("mbi,nbi->mnb", a, integers(format, data).double())  # (m, n, b)
    out = (dots.float() * (xd[:, None, :] * d.float()[None])).sum(-1)
    if format == "q4_1":  # Σ (u d + m) a = d Σ u a + m Σ a
        out = out + (m.float()[None] * (xd * a.sum(-1).float())[:, None, :]).sum(-1)
    return out
