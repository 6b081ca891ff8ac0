"""The block kernel against fp32 ``F.linear``, per product (issue: quantised decoding on every
CPU), for Q4_1 and Q8_0: at each number of activation rows, the integer dot products (attnkit's
C kernel: AVX2 or NEON) on the blocks as they are and packed (:func:`attnkit.kernels.pack`), and the dense path
(the blocks dequantised, then one fp32 product), on the shapes of SmolLM2-135M and the demo
translator. Where the dense path overtakes the integer one is ``kernels.DENSE_ROWS``. And all of
GPT-2 124M's products of a token, from memory: the read rates per format."""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

from attnkit import kernels
from attnkit.kernels import build
from benchmarks.common import Comparison, compare

SHAPES = {"SmolLM2 q": (576, 576), "SmolLM2 gate": (1536, 576), "SmolLM2 down": (576, 1536), "Marian FFN": (2048, 512)}
CALLS = 50  # products per timing: one takes microseconds


def _products(x: torch.Tensor, fmt: str, weight: tuple, dense_rows: int) -> None:
    build.DENSE_ROWS, saved = dense_rows, build.DENSE_ROWS
    try:
        for _ in range(CALLS):
            kernels.block_matmuls(x, fmt, [weight], kernel=kernels.native())
    finally:
        build.DENSE_ROWS = saved


def _linear(x: torch.Tensor, w: torch.Tensor) -> None:
    for _ in range(CALLS):
        F.linear(x, w)


def run(repeats: int = 7, small: bool = False, formats: tuple[str, ...] = ("q4_1", "q8_0")) -> list[Comparison]:
    if not kernels.available():
        return []
    shapes = dict(list(SHAPES.items())[:1]) if small else SHAPES
    results = [result for fmt in formats for result in _run(fmt, shapes, repeats, small)]
    return results + [_from_memory(fmt, repeats, layers=1 if small else 12) for fmt in formats]


# GPT-2 124M's products of one layer: q, k and v; the attention's output; the FFN's two.
GPT2_LAYER = ((2304, 768), (768, 768), (3072, 768), (768, 3072))
BYTES_PER_WEIGHT = {"q4_1": 20 / 32, "q4_0": 18 / 32, "q8_0": 34 / 32}


def _from_memory(fmt: str, repeats: int, layers: int = 12) -> Comparison:
    """All the products of GPT-2 124M's 12 layers (``layers``: fewer, as a smoke test) at batch 1,
    each weight its own (packed): too many bytes for the caches, so they are read from memory, as
    in a token of decoding. The read rates (notes) tell whether a faster instruction could help:
    where Q4_1, with twice Q8_0's arithmetic per byte, reads as fast as Q8_0, the memory is the
    limit, not the arithmetic."""
    torch.manual_seed(0)
    dense = [torch.randn(n, k) / k**0.5 for _ in range(layers) for n, k in GPT2_LAYER]
    held = [kernels.split(fmt, *kernels.quantize(w, fmt)) for w in dense]
    inputs = {k: torch.randn(1, k) for k in (768, 3072)}
    weights = sum(w.numel() for w in dense)

    def ours() -> None:
        for w, blocks in zip(dense, held, strict=True):
            kernels.block_matmuls(inputs[w.shape[1]], fmt, [blocks], kernel=kernels.native())

    def peer() -> None:
        for w in dense:
            F.linear(inputs[w.shape[1]], w)

    result = compare(
        f"GPT-2's {layers} layers from memory, {fmt}, 1 row", ours, peer, work=1, unit="passes",
        peer_name="fp32 F.linear", repeats=repeats,
    )  # fmt: skip
    result.notes[f"{fmt} GB/s"] = weights * BYTES_PER_WEIGHT[fmt] / statistics.median(result.ours) / 1e9
    result.notes["fp32 GB/s"] = weights * 4 / statistics.median(result.peer) / 1e9
    return result


def _run(fmt: str, shapes: dict[str, tuple[int, int]], repeats: int, small: bool) -> list[Comparison]:
    results = []
    for name, (n, k) in shapes.items():
        torch.manual_seed(0)
        w = torch.randn(n, k) / k**0.5
        blocks = kernels.quantize(w, fmt)
        split = kernels.split(fmt, *blocks)
        paths = [("integer", False), ("dense", True), ("packed", False)]
        for rows in (1, 4) if small else (1, 2, 4, 8, 16, 32, 128, 512):
            x = torch.randn(rows, k)
            for path, dense in paths:
                results.append(
                    compare(
                        f"{name} {n}×{k} {fmt}, {rows} rows, {path}",
                        lambda x=x, b=split if path == "packed" else blocks, d=1 if dense else rows + 1: (
                            _products(x, fmt, b, d)
                        ),
                        lambda x=x, w=w: _linear(x, w),
                        work=CALLS * rows, unit="rows", peer_name="fp32 F.linear", repeats=repeats,
                    )
                )  # fmt: skip
    return results
