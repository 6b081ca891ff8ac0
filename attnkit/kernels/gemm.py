"""Many activation rows (a batch, its beams, a prompt) times int8 weights: PyTorch's dynamic int8
GEMM, ``torch.ops.quantized.linear_dynamic``, the product CTranslate2's int8 is (int8 weights per
output row, the activations quantised at each product, integer products accumulated in int32).

The block kernel (:mod:`attnkit.kernels`) reads its weights fastest at one row, but does every
row's dot products alone: at 128 rows (a batch of 32 sentences, 4 beams each) it took 3 ms for a
(2048, 512) Q8_0 weight where fp32 took 1.1 ms and this GEMM 0.33 ms (AMX), and 41 ms for a
32,000-word vocabulary projection where this took 1.6 ms (``python -m benchmarks blocks``,
docs/performance.md). So a layer of blocks meets ``MANY_ROWS`` rows or more here: its weights
dequantised once and requantised per output row (:func:`pack`, held beside the blocks), the
activations quantised per product to 8 bits by the engine, one scale for the whole input; an
input too wide for one scale (:data:`MAX_SPREAD`, :func:`suits`) keeps the block kernel.

Two engines of PyTorch's run it (:func:`engine`): oneDNN where the CPU has AMX's int8 tiles
(4x fbgemm's speed on the vocabulary projection there), fbgemm on every other x86-64 CPU (AVX2's
``vpmaddubsw``, AVX-512 VNNI where it is; fbgemm keeps its activations to 7 bits so that its 16-bit
pair sums cannot saturate). ARM64 has neither, and keeps the block kernel at every row count.
``ATTNKIT_INT8_GEMM`` (onednn, fbgemm or off) picks one by hand, so that each is tested on any x86
machine where it is exact: oneDNN takes 8-bit activations, whose pair sums saturate 16 bits without
VNNI (:func:`onednn_exact`; with ``ONEDNN_MAX_CPU_ISA=AVX2`` 3% of a product's outputs were wrong by up
to 60x). ``ATTNKIT_CPU_CLASS`` below avx512-bf16 takes fbgemm, as an AVX2 CPU would. To time an
AVX2 CPU's fbgemm on a bigger one, also set ``FBGEMM_ENABLE_INSTRUCTIONS=AVX2`` before Python.

``torch.compile`` cannot trace the engines' packed weights: a compiled step keeps the block kernel.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import warnings
from collections.abc import Iterator

import torch
from torch import Tensor

from attnkit.machine import cpu_class, cpu_flags

__all__ = ["ENGINES", "GEMM_ENV", "MANY_ROWS", "MAX_SPREAD", "engine", "matmul", "onednn_exact", "pack", "suits"]

GEMM_ENV = "ATTNKIT_INT8_GEMM"
ENGINES = ("onednn", "fbgemm")
# The largest spread of an input, (max - min) / RMS, that this GEMM takes: one scale for the whole
# input quantises it finely enough. Measured per product: a trained translator's inputs (the demo's,
# beam 4) spread 5.6-11 (90%; 34 at most), and within 0.1 BLEU of fp32 through the GEMM; SmolLM2's
# spread 15-600 (median 32: a few channels carry outliers, as in LLM.int8), and through the GEMM its
# held-out perplexity rose 1.75x. A wider input keeps the block kernel, per block of 32.
MAX_SPREAD = 16.0
# From this many activation rows on, a layer of blocks takes this GEMM: at 8 rows it won over the
# block kernel on every shape measured (2-3x on both engines, fbgemm with AVX2 forced 1.3-2.6x);
# at 1 to 4 the block kernel's int16 activations keep fp32's greedy tokens (module
# attnkit.models.weights) at about the same speed.
MANY_ROWS = 8


def _onednn_isa() -> str:
    """oneDNN's ISA cap, ``$ONEDNN_MAX_CPU_ISA`` ("ALL" where unset), upper case."""
    return os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper() or "ALL"


def onednn_exact() -> bool:
    """Whether oneDNN multiplies 8-bit activations by int8 weights without saturating here: the CPU
    has VNNI or AMX's int8 tiles (32-bit sums), and ``$ONEDNN_MAX_CPU_ISA`` does not cap it below them."""
    capped = _onednn_isa() in ("SSE41", "AVX", "AVX2", "AVX512_CORE")
    return not capped and bool({"avx512_vnni", "avx_vnni", "amx_int8"} & cpu_flags())


def engine() -> str | None:
    """The engine that runs the GEMM here: ``$ATTNKIT_INT8_GEMM`` where set (None for "off"),
    else oneDNN on a CPU of class avx512-bf16 with AMX int8 tiles that oneDNN may use, fbgemm on
    any other x86-64 CPU, None on ARM64 (the block kernel at every row count)."""
    chosen = os.environ.get(GEMM_ENV, "").strip().lower()
    if chosen:
        if chosen not in (*ENGINES, "off"):
            raise ValueError(f"{GEMM_ENV}={chosen} is not an int8 GEMM engine; use {', '.join(ENGINES)} or off")
        if chosen == "onednn" and not onednn_exact():
            raise ValueError(
                f"{GEMM_ENV}=onednn would saturate here: oneDNN has no VNNI or AMX on this CPU"
                f" (ONEDNN_MAX_CPU_ISA={_onednn_isa()}); use fbgemm or off"
            )
        return None if chosen == "off" else chosen
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    amx = "amx_int8" in cpu_flags() and (_onednn_isa() in ("ALL", "DEFAULT") or "AMX" in _onednn_isa())
    return "onednn" if cpu_class().native_bf16 and amx else "fbgemm"


@contextlib.contextmanager
def _engine(name: str) -> Iterator[None]:
    """PyTorch's quantised engine set to ``name`` while packing (packed weights remember theirs)."""
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = before


def pack(q: Tensor, scales: Tensor, bias: Tensor | None, name: str) -> torch.ScriptObject:
    """int8 weights ``q`` (n, k) of scales ``scales`` (n,) per output row, and an fp32 ``bias``
    (n,) or None, packed for engine ``name`` (the weight ``q * scales[:, None]``; the bias is added
    in the GEMM's own pass over its output)."""
    with _engine(name), warnings.catch_warnings():
        # torch 2.13 warns that quantised tensors will go; its packed-weight GEMMs have no other door
        warnings.simplefilter("ignore", UserWarning)
        zeros = torch.zeros(len(scales), dtype=torch.long)
        weight = torch._make_per_channel_quantized_tensor(q, scales.double(), zeros, 0)
        return torch.ops.quantized.linear_prepack(weight, None if bias is None else bias.float().contiguous())


def suits(x: Tensor) -> bool:
    """Whether ``x`` (m, k) is narrow enough for one scale: (max - min) / RMS <= :data:`MAX_SPREAD`."""
    low, high = torch.aminmax(x)
    rms = torch.linalg.vector_norm(x) / math.sqrt(x.numel())  # one pass, no (m, k) temporary
    return bool(high - low <= MAX_SPREAD * rms)


def matmul(x: Tensor, packed: torch.ScriptObject, name: str) -> Tensor:
    """``x`` (m, k) fp32 times the weights packed for engine ``name``, transposed, plus their bias:
    (m, n) fp32, ``x``
    quantised to 8 bits with one scale and zero point (7 bits on fbgemm, whose ``vpmaddubsw`` pair
    sums would saturate at 8 without VNNI; oneDNN's int32 products cannot)."""
    return torch.ops.quantized.linear_dynamic(x.contiguous(), packed, name == "fbgemm")
