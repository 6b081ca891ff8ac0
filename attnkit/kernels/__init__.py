"""CPU kernels PyTorch lacks, written in C, compiled at first use and cached, each beside the
pure-PyTorch reference it is tested against (:mod:`attnkit.kernels.blocks`).

``block_matmul``: fp32 activations times weights in llama.cpp's blocks of 32 (Q8_0, Q4_0, Q4_1:
:mod:`attnkit.kernels.blocks`), for CPUs where PyTorch has no fast low-bit product
(``torch._weight_int8pack_mm`` is fast only with bf16 inputs, 10-20x slower with fp32 ones,
and its 4-bit kernels need AVX-512). The activations are quantised to int8 per block at each
product and each block's integer dot product is taken with AVX2's ``vpmaddubsw``/``vpmaddwd``
(``blocks_avx2.c``): the same kernel runs on AVX512 CPUs, which have AVX2 too.

The library is plain C, no torch headers, built with the system's C compiler (``$CC``, else
``cc``: the compiler inductor needs too) in about a second, where a ``torch.utils.cpp_extension``
build of the same code takes a minute on two cores; it is loaded with ``ctypes`` and wrapped as
the custom op ``attnkit::block_matmul`` (opaque to ``torch.compile``). The cache:
``$XDG_CACHE_HOME/attnkit/kernels`` (else ``~/.cache/...``), one file per source and flags,
written atomically.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from torch import Tensor

from attnkit.kernels.blocks import BLOCK, FORMATS, check, matmul_reference, quantize, quantize_activations
from attnkit.machine import cpu_flags

__all__ = [
    "BLOCK",
    "FORMATS",
    "KERNELS",
    "KernelUnavailableError",
    "available",
    "block_matmul",
    "matmul_reference",
    "quantize",
    "quantize_activations",
]

log = logging.getLogger("attnkit.kernels")

SOURCE = Path(__file__).with_name("blocks_avx2.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC", "-std=c11")
FEATURES = frozenset({"avx2", "fma", "f16c"})
KERNELS = ("auto", "avx2", "reference")
_CODES = {name: code for code, name in enumerate(FORMATS)}  # blocks_avx2.c's enum


class KernelUnavailableError(RuntimeError):
    """A kernel asked for by name that this machine cannot build or run."""


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "attnkit" / "kernels"


def _avx2_library() -> ctypes.CDLL:
    """The compiled ``blocks_avx2.c``, built once per source and flags; a one-line
    :class:`KernelUnavailableError` where the CPU lacks AVX2/FMA/F16C, there is no C compiler, or
    the cache cannot hold or load it (remembered: the build is not tried again)."""
    built = _build()
    if isinstance(built, KernelUnavailableError):
        raise built
    return built


@functools.cache
def _build() -> ctypes.CDLL | KernelUnavailableError:
    missing = FEATURES - cpu_flags()
    if missing:
        return KernelUnavailableError(f"the AVX2 block kernel needs {', '.join(sorted(missing))}, which this CPU lacks")
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        return KernelUnavailableError(
            f"the AVX2 block kernel is compiled at first use and there is no C compiler ({compiler!r}); "
            "install one (e.g. apt-get install gcc) or set CC"
        )
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join((compiler, *FLAGS)).encode()).hexdigest()[:16]
    target = _cache_dir() / f"{SOURCE.stem}-{digest}.so"
    try:
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
                built = Path(scratch) / target.name
                done = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(built)], capture_output=True, text=True)
                if done.returncode != 0:
                    first = (done.stderr.strip().splitlines() or ["no message"])[0]
                    return KernelUnavailableError(f"the AVX2 block kernel did not compile with {compiler}: {first}")
                os.replace(built, target)  # atomic: a concurrent build writes the same file
        library = ctypes.CDLL(str(target))
    except OSError as err:
        return KernelUnavailableError(f"the AVX2 block kernel cannot be built or loaded in {target.parent} ({err})")
    library.attnkit_block_matmul.restype = ctypes.c_int
    library.attnkit_block_matmul.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 3
    return library


def available(kernel: str = "avx2") -> bool:
    """Whether ``kernel`` runs here (building it if need be); the reason goes to the log."""
    if kernel == "reference":
        return True
    try:
        _avx2_library()
    except KernelUnavailableError as err:
        log.info("%s; block formats run on the reference kernel", err)
        return False
    return True


@functools.cache
def _auto() -> str:
    return "avx2" if available("avx2") else "reference"


def _run_avx2(x: Tensor, format: str, data: Tensor, d: Tensor, m: Tensor | None) -> Tensor:
    """The C kernel on ``x`` (m, k) fp32 and a weight's blocks (:mod:`attnkit.kernels.blocks`)."""
    x, data, d = x.contiguous(), data.contiguous(), d.contiguous()
    m = d if m is None else m.contiguous()  # unused but for q4_1
    out = torch.empty(x.shape[0], data.shape[0], dtype=torch.float32)
    status = _avx2_library().attnkit_block_matmul(
        _CODES[format], x.data_ptr(), data.data_ptr(), d.data_ptr(), m.data_ptr(), out.data_ptr(),
        x.shape[0], data.shape[0], x.shape[1],
    )  # fmt: skip
    if status != 0:
        raise RuntimeError(f"the AVX2 block kernel failed (status {status}: 1 = k not a multiple of 32, 2 = no memory)")
    return out


@torch.library.custom_op("attnkit::block_matmul", mutates_args=())
def _block_matmul_avx2(x: Tensor, format: str, data: Tensor, d: Tensor, m: Tensor | None) -> Tensor:
    """:func:`_run_avx2` as an op ``torch.compile`` keeps whole (eager calls skip its dispatch: 9 µs)."""
    return _run_avx2(x, format, data, d, m)


@_block_matmul_avx2.register_fake
def _(x: Tensor, format: str, data: Tensor, d: Tensor, m: Tensor | None) -> Tensor:
    return x.new_empty(x.shape[0], data.shape[0])


def block_matmul(
    x: Tensor, format: str, data: Tensor, d: Tensor, m: Tensor | None = None, kernel: str = "auto"
) -> Tensor:
    """``x`` (m, k) fp32 times the weight (n, k) held as ``format``'s blocks ``data``, ``d`` (fp16
    scales, (n, k / 32)) and, for q4_1, ``m`` (its minima): (m, n) fp32, ``x`` quantised per block
    of 32 (:mod:`attnkit.kernels.blocks`). ``kernel``: "avx2", "reference", or "auto" (AVX2
    where it runs). k must be a multiple of 32 (pad both sides with zeros)."""
    if kernel != "reference" and torch.compiler.is_compiling():
        # The op, opaque to the graph: a model holds blocks for the C kernel only where it runs.
        return _block_matmul_avx2(x.float(), format, data, d, m)
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r} is not a block kernel; use one of {', '.join(KERNELS)}")
    check(format)
    k = data.shape[-1] * (2 if format != "q8_0" else 1)
    if x.shape[-1] % BLOCK or x.shape[-1] != k:
        raise ValueError(f"x (…, {x.shape[-1]}) and the {format} weight (…, {k}) need one k, a multiple of {BLOCK}")
    if (format == "q4_1") != (m is not None):
        raise ValueError(f"{format} takes {'its' if format == 'q4_1' else 'no'} block minima m")
    if kernel == "auto":
        kernel = _auto()
    if kernel == "reference":
        return matmul_reference(x, format, data, d, m)
    return _run_avx2(x.float(), format, data, d, m)  # a kernel that cannot run: its one-line error
