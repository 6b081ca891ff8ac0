"""The block products: fp32 activations times weights in llama.cpp's blocks of 32 (Q8_0, Q4_0,
Q4_1: :mod:`attnkit.kernels.blocks`), for CPUs where PyTorch has no fast low-bit product
(``torch._weight_int8pack_mm`` is fast only with bf16 inputs, and its 4-bit kernels need AVX-512).
The activations are quantised per block at each product (int8 for the 4-bit formats, int16 for
Q8_0: 256 times finer, fp32's greedy tokens where int8 flipped near-ties), then each block's exact
integer dot products run in the machine's C kernel (:mod:`attnkit.kernels.build`: AVX2 on x86-64,
NEON on ARM64), or in the pure-PyTorch reference they are tested against ("reference").

:func:`block_matmuls` takes several weights that meet one input (attention's q, k and v; a gated
FFN's gate and up) in one call: at batch 1 a small product costs more in its call than in its
arithmetic. :func:`split` holds a weight's groups of 8 rows packed as llama.cpp's REPACK holds
them, which the kernel reads fastest. Unpacked blocks meeting ``DENSE_ROWS`` activation rows or
more are dequantised and multiplied dense in fp32, where their integer products lose; on x86-64 a
layer meeting 8 rows or more uses PyTorch's int8 GEMM instead (:mod:`attnkit.kernels.gemm`). Why
each threshold is where it is, measured: docs/performance.md.

The op ``attnkit::block_matmul`` (opaque to ``torch.compile``; eager products call it too) gets
the C++ kernel where it builds and :func:`_run_ctypes`, Python over the same C code, where it
does not (the reason logged)."""

from __future__ import annotations

import ctypes
import functools
import logging
import platform
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.kernels import build
from attnkit.kernels.blocks import (
    BLOCK,
    FORMATS,
    PACKED_ROWS,
    check,
    dequantize,
    matmul_reference,
    pack,
    packed_bytes,
    unpack,
)
from attnkit.kernels.build import ARCHITECTURES, KERNELS, TITLES, KernelUnavailableError, native

log = logging.getLogger("attnkit.kernels")

_CODES = {name: code for code, name in enumerate(FORMATS)}  # blocks.c's enum


def _library(kernel: str | None = None) -> ctypes.CDLL:
    """The compiled ``blocks.c`` (``kernel``: this machine's, :func:`native`), built once per source
    and flags; a one-line :class:`KernelUnavailableError` where it is another architecture's, the
    CPU lacks a feature it needs, there is no C compiler, or the cache cannot hold or load it
    (remembered: the build is not tried again). The op ``attnkit::block_matmul`` has its kernel
    once this returns (:func:`_register`)."""
    kernel = kernel or native()
    if kernel != native():
        raise KernelUnavailableError(
            f"the {TITLES[kernel]} block kernel runs on {ARCHITECTURES[kernel]} CPUs, not this "
            f"{platform.machine()} one: use kernel='auto' (or {native()!r})"
        )
    built = build.c_library()
    if isinstance(built, KernelUnavailableError):
        raise built
    _register()
    return built


@functools.cache
def _register() -> str:
    """Give the op ``attnkit::block_matmul`` its CPU kernel, once: the C++ one where it builds
    and loads, else :func:`_run_ctypes` (the reason logged). Returns which: "c++" or "python"."""
    built = build.op_library()
    if isinstance(built, Path):
        try:
            torch.ops.load_library(str(built))
            return "c++"
        except (OSError, RuntimeError) as err:  # dlopen's error, or the dispatcher's
            built = f"cannot be loaded from {built} ({err})"
    log.info("the block op's C++ kernel: %s; its products pass through Python (about 25 µs a call more)", built)
    _LIBRARY.impl("block_matmul", _run_ctypes, "CPU")
    return "python"


def available(kernel: str | None = None) -> bool:
    """Whether ``kernel`` (this machine's C kernel: :func:`native`) runs here, building it if need
    be; the reason why not goes to the log."""
    if kernel == "reference":
        return True
    try:
        _library(kernel)
    except KernelUnavailableError as err:
        log.info("%s; block formats run on the reference kernel", err)
        return False
    return True


@functools.cache
def _auto() -> str:
    return native() if available() else "reference"


# One weight's blocks: data, d (fp16 scales), m (q4_1's minima), and optionally its packed groups
# of 8 rows (:func:`pack`); where those are given, data, d and m hold only the rows after them
# (the last n mod 8: :func:`split`).
Weight = tuple[Tensor, Tensor, "Tensor | None"] | tuple[Tensor, Tensor, "Tensor | None", "Tensor | None"]
_NONE = torch.empty(0, dtype=torch.uint8)  # no packed groups: the op's lists hold tensors only


_PLANS: dict[tuple[int, ...], tuple] = {}  # the C arguments of each set of weights, by their addresses


def split(format: str, data: Tensor, d: Tensor, m: Tensor | None = None) -> Weight:
    """A weight's blocks as the kernel reads them fastest: its groups of 8 rows packed
    (:func:`pack`) and its other rows (the last n mod 8) as they are, ``(data, d, m, packed)``;
    the blocks unchanged, with no packed groups, where it has fewer than 8 rows."""
    packed = pack(format, data, d, m)
    if packed is None:
        return data, d, m, None
    rows = data.shape[0] // PACKED_ROWS * PACKED_ROWS
    rest = [None if t is None else t[rows:].clone() for t in (data, d, m)]
    return rest[0], rest[1], rest[2], packed


def rows(format: str, data: Tensor, packed: Tensor | None, k: int) -> int:
    """The rows of a weight of ``k`` inputs held as ``data`` and, if any, ``packed`` groups of 8."""
    groups = 0 if packed is None else packed.numel() // ((k // BLOCK) * packed_bytes(format))
    return data.shape[0] + PACKED_ROWS * groups


def _plan(format: str, data: list[Tensor], d: list[Tensor], m: list[Tensor], packed: list[Tensor], k: int) -> tuple:
    """The C arrays of the weights' addresses and row counts, the total row count and whether any
    is packed: built once per set of weights (a model's weights stay put), looked up by address."""
    key = (*(t.data_ptr() for t in (*data, *d, *m, *packed)), *(t.shape[0] for t in data), k)
    plan = _PLANS.get(key)
    if plan is None:
        pointers = ctypes.c_void_p * len(data)
        n = [rows(format, t, p, k) for t, p in zip(data, packed, strict=True)]
        ptrs = [[t.data_ptr() if t.numel() else 0 for t in ts] for ts in (data, d, m or d, packed)]
        plan = (*(pointers(*p) for p in ptrs), (ctypes.c_int64 * len(n))(*n), sum(n), any(ptrs[3]))
        if len(_PLANS) >= 4096:  # weights freed and others made: start again
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def _run_ctypes(
    x: Tensor, format: str, data: list[Tensor], d: list[Tensor], m: list[Tensor], packed: list[Tensor]
) -> Tensor:
    """The C kernel on ``x`` (m, k) fp32 and the weights' blocks side by side: (m, Σ n_i). At
    batch 1 its Python costs as much as a small product: kept to what matters."""
    x = x.contiguous()
    if not all(t.is_contiguous() for t in (*data, *d, *m)):
        data, d, m = [t.contiguous() for t in data], [t.contiguous() for t in d], [t.contiguous() for t in m]
    w, wd, wm, groups, n, width, any_packed = _plan(format, data, d, m, packed, x.shape[1])  # pack's is contiguous
    library = _library()
    if x.shape[0] >= build.DENSE_ROWS and not any_packed:  # dequantised, then one dense fp32 product
        dense = torch.empty(width, x.shape[1], dtype=torch.float32)
        code = _CODES[format]
        _status(library.attnkit_block_dequantize(code, len(data), w, wd, wm, n, dense.data_ptr(), x.shape[1]))
        return torch.mm(x, dense.T)
    out = torch.empty(x.shape[0], width, dtype=torch.float32)
    _status(
        library.attnkit_block_matmul(
            _CODES[format], x.data_ptr(), len(data), w, wd, wm, groups, n, out.data_ptr(), x.shape[0], x.shape[1]
        )
    )
    return out


def _status(status: int) -> None:
    if status != 0:
        raise RuntimeError(
            f"the {TITLES[native()]} block kernel failed (status {status}: 1 = k not a multiple of 32, 2 = no memory, "
            "4 = more than 8 weights)"
        )


# The op ``attnkit::block_matmul``, which ``torch.compile`` keeps whole; its CPU kernel is given
# by :func:`_register` (C++, else :func:`_run_ctypes`) once the C code builds. A library's op, not
# ``torch.library.custom_op``: at batch 1 the latter's dispatch cost 6-35 µs a call more (121
# calls a token for SmolLM2), for an autograd it has no use for (quantised weights are for
# inference).
_LIBRARY = torch.library.Library("attnkit", "FRAGMENT")
_LIBRARY.define("block_matmul(Tensor x, str format, Tensor[] data, Tensor[] d, Tensor[] m, Tensor[] packed) -> Tensor")


@torch.library.register_fake("attnkit::block_matmul")
def _(x: Tensor, format: str, data: list[Tensor], d: list[Tensor], m: list[Tensor], packed: list[Tensor]) -> Tensor:
    k = x.shape[1]
    return x.new_empty(x.shape[0], sum(rows(format, t, p, k) for t, p in zip(data, packed, strict=True)))


def block_matmul(
    x: Tensor,
    format: str,
    data: Tensor,
    d: Tensor,
    m: Tensor | None = None,
    kernel: str = "auto",
    packed: Tensor | None = None,
) -> Tensor:
    """``x`` (m, k) fp32 times the weight (n, k) held as ``format``'s blocks ``data``, ``d`` (fp16
    scales, (n, k / 32)) and, for q4_1, ``m`` (its minima): (m, n) fp32, ``x`` quantised per block
    of 32 (:mod:`attnkit.kernels.blocks`); from ``build.DENSE_ROWS`` rows of ``x`` on, ``x`` as it is
    times the dequantised weight, unless the weight is packed: ``packed`` its first n // 8 groups
    of 8 rows as :func:`pack` gives them, and ``data``, ``d``, ``m`` only the rows after those
    (:func:`split` gives all four), integer at every row count.
    ``kernel``: "avx2" (x86-64), "neon" (ARM64), "reference", or "auto" (the machine's C kernel
    where it runs). k must be a multiple of 32
    (pad both sides with zeros)."""
    return block_matmuls(x, format, [(data, d, m, packed)], kernel)


def block_matmuls(x: Tensor, format: str, weights: Sequence[Weight], kernel: str = "auto") -> Tensor:
    """``x`` (m, k) times several weights of one ``format`` at once (attention's q, k and v, a gated
    FFN's gate and up): (m, Σ n_i), their products side by side, as :func:`block_matmul` gives
    each. One call, one quantisation of ``x`` and one team of threads for all (at most 8)."""
    if kernel != "reference" and torch.compiler.is_compiling():
        # The op, opaque to the graph: a model holds blocks for the C kernel only where it runs.
        return torch.ops.attnkit.block_matmul(x.float(), format, *_lists(weights))
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r} is not a block kernel; use one of {', '.join(KERNELS)}")
    check(format)
    if not 1 <= len(weights) <= 8:
        raise ValueError(f"block_matmuls takes 1 to 8 weights, not {len(weights)}")
    for data, _, m, *packed in weights:
        k = data.shape[-1] * (2 if format != "q8_0" else 1)
        if x.shape[-1] % BLOCK or x.shape[-1] != k:
            raise ValueError(f"x (…, {x.shape[-1]}) and the {format} weight (…, {k}) need one k, a multiple of {BLOCK}")
        if (format == "q4_1") != (m is not None):
            raise ValueError(f"{format} takes {'its' if format == 'q4_1' else 'no'} block minima m")
        if packed and packed[0] is not None:
            group = (k // BLOCK) * packed_bytes(format)  # a packed group of 8 rows
            if packed[0].dtype != torch.uint8 or not packed[0].numel() or packed[0].numel() % group:
                raise ValueError(
                    f"packed holds {packed[0].numel()} bytes of {packed[0].dtype} where kernels.pack gives "
                    f"{group} for each group of 8 rows of this {format} weight; pass what pack returns"
                )
            if data.shape[0] >= 8:
                raise ValueError(
                    f"a packed {format} weight holds its last n mod 8 rows as blocks, not {data.shape[0]}: "
                    "pass kernels.split's (data, d, m, packed)"
                )
    if kernel == "auto":
        kernel = _auto()
    if kernel == "reference":  # the same arithmetic as the C kernels'
        if x.shape[0] >= build.DENSE_ROWS and not any(len(w) > 3 and w[3] is not None for w in weights):
            return F.linear(x.float(), torch.cat([dequantize(format, *weight[:3]) for weight in weights]))
        return torch.cat([matmul_reference(x, format, *whole(format, weight, x.shape[1])) for weight in weights], -1)
    _library(kernel)  # a kernel that cannot run: its one-line error
    return torch.ops.attnkit.block_matmul(x.float(), format, *_lists(weights))


def whole(format: str, weight: Weight, k: int) -> tuple[Tensor, Tensor, Tensor | None]:
    """All the blocks ``(data, d, m)`` of a weight as :func:`split` holds it (its packed rows
    unpacked before the rest)."""
    data, d, m, *packed = weight
    if not packed or packed[0] is None:
        return data, d, m
    first = unpack(format, packed[0], k)
    return tuple(None if a is None else torch.cat([a, b]) for a, b in zip(first, (data, d, m), strict=True))  # type: ignore[return-value]


def _lists(weights: Sequence[Weight]) -> tuple[list[Tensor], list[Tensor], list[Tensor], list[Tensor]]:
    """The weights' data, scales, (q4_1's, else none) minima and packed groups (else empty), each
    as a list: the op's arguments."""
    packed = [w[3] if len(w) > 3 and w[3] is not None else _NONE for w in weights]
    return [w[0] for w in weights], [w[1] for w in weights], [w[2] for w in weights if w[2] is not None], packed
