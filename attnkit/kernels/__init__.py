"""CPU kernels PyTorch lacks, written in C, compiled at first use and cached, each beside the
pure-PyTorch reference it is tested against: llama.cpp's blocks of 32 (:mod:`attnkit.kernels.blocks`:
the formats and their reference arithmetic), built for the machine (:mod:`attnkit.kernels.build`),
multiplied through the op ``attnkit::block_matmul`` (:mod:`attnkit.kernels.ops`), and PyTorch's
own int8 GEMM for many rows (:mod:`attnkit.kernels.gemm`)."""

from __future__ import annotations

from attnkit.kernels.blocks import (
    BLOCK,
    FORMATS,
    dequantize,
    matmul_reference,
    pack,
    packed_bytes,
    quantize,
    quantize_activations,
    unpack,
)
from attnkit.kernels.build import (
    ARCHITECTURES,
    DENSE_ROWS,
    FEATURES,
    FLAGS,
    KERNELS,
    SOURCE,
    TITLES,
    KernelUnavailableError,
    isa_flags,
    native,
)
from attnkit.kernels.ops import Weight, available, block_matmul, block_matmuls, rows, split, whole

__all__ = [
    "ARCHITECTURES",
    "BLOCK",
    "DENSE_ROWS",
    "FEATURES",
    "FLAGS",
    "FORMATS",
    "KERNELS",
    "SOURCE",
    "TITLES",
    "KernelUnavailableError",
    "Weight",
    "available",
    "block_matmul",
    "block_matmuls",
    "dequantize",
    "isa_flags",
    "matmul_reference",
    "native",
    "pack",
    "packed_bytes",
    "quantize",
    "quantize_activations",
    "rows",
    "split",
    "unpack",
    "whole",
]
