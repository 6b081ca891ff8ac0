"""CPU kernels PyTorch lacks, written in C, compiled at first use and cached, each beside the
pure-PyTorch reference it is tested against.

``int8_matmul``: fp32 activations times int8 weights, for CPUs without native bf16 (where
``torch._weight_int8pack_mm`` is fast only with bf16 inputs, 10-20x slower with fp32 ones). The
weights are int8 in blocks of 32 along their inputs with one fp32 scale each (llama.cpp's
Q8_0), the activations are quantised the same way at each product, and each block's integer
dot product is taken with AVX2's ``vpmaddubsw``/``vpmaddwd`` (``int8_avx2.c``).

The library is plain C, no torch headers, built with the system's C compiler (``$CC``, else
``cc``: the compiler inductor needs too) in about a second, where a ``torch.utils.cpp_extension``
build of the same code takes a minute on two cores; it is loaded with ``ctypes`` and wrapped as
the custom op ``attnkit::int8_matmul`` (opaque to ``torch.compile``). The cache:
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

from attnkit.machine import cpu_flags

log = logging.getLogger("attnkit.kernels")

BLOCK = 32  # activations are quantised in blocks of this many values; k is padded to it
SOURCE = Path(__file__).with_name("int8_avx2.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC", "-std=c11")
KERNELS = ("auto", "avx2", "reference")


class KernelUnavailableError(RuntimeError):
    """A kernel asked for by name that this machine cannot build or run."""


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "attnkit" / "kernels"


def _avx2_library() -> ctypes.CDLL:
    """The compiled ``int8_avx2.c``, built once per source and flags; a one-line
    :class:`KernelUnavailableError` where the CPU lacks AVX2/FMA, there is no C compiler, or the
    cache cannot hold or load it (remembered: the build is not tried again)."""
    built = _build()
    if isinstance(built, KernelUnavailableError):
        raise built
    return built


@functools.cache
def _build() -> ctypes.CDLL | KernelUnavailableError:
    missing = {"avx2", "fma"} - cpu_flags()
    if missing:
        return KernelUnavailableError(f"the int8 AVX2 kernel needs {', '.join(sorted(missing))}, which this CPU lacks")
    compiler = os.environ.get("CC", "cc")
    if shutil.which(compiler) is None:
        return KernelUnavailableError(
            f"the int8 AVX2 kernel is compiled at first use and there is no C compiler ({compiler!r}); "
            "install one (e.g. apt-get install gcc) or set CC"
        )
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join((compiler, *FLAGS)).encode()).hexdigest()[:16]
    target = _cache_dir() / f"int8_avx2-{digest}.so"
    try:
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
                built = Path(scratch) / target.name
                done = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(built)], capture_output=True, text=True)
                if done.returncode != 0:
                    first = (done.stderr.strip().splitlines() or ["no message"])[0]
                    return KernelUnavailableError(f"the int8 AVX2 kernel did not compile with {compiler}: {first}")
                os.replace(built, target)  # atomic: a concurrent build writes the same file
        library = ctypes.CDLL(str(target))
    except OSError as err:
        return KernelUnavailableError(f"the int8 AVX2 kernel cannot be built or loaded in {target.parent} ({err})")
    library.attnkit_int8_matmul.restype = ctypes.c_int
    library.attnkit_int8_matmul.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3
    return library


def available(kernel: str = "avx2") -> bool:
    """Whether ``kernel`` runs here (building it if need be); the reason goes to the log."""
    if kernel == "reference":
        return True
    try:
        _avx2_library()
    except KernelUnavailableError as err:
        log.info("%s; int8 runs on the reference kernel", err)
        return False
    return True


@functools.cache
def _auto() -> str:
    return "avx2" if available("avx2") else "reference"


def _run_avx2(x: Tensor, q: Tensor, scales: Tensor) -> Tensor:
    """The C kernel on ``x`` (m, k) fp32, ``q`` (n, k) int8, ``scales`` (n, k / 32) fp32."""
    x, q, scales = x.contiguous(), q.contiguous(), scales.contiguous()
    out = torch.empty(x.shape[0], q.shape[0], dtype=torch.float32)
    status = _avx2_library().attnkit_int8_matmul(
        x.data_ptr(), q.data_ptr(), scales.data_ptr(), out.data_ptr(), x.shape[0], q.shape[0], x.shape[1]
    )
    if status != 0:
        raise RuntimeError(f"the int8 AVX2 kernel failed (status {status}: 1 = k not a multiple of 32, 2 = no memory)")
    return out


@torch.library.custom_op("attnkit::int8_matmul", mutates_args=())
def _int8_matmul_avx2(x: Tensor, q: Tensor, scales: Tensor) -> Tensor:
    """:func:`_run_avx2` as an op ``torch.compile`` keeps whole (eager calls skip its dispatch: 9 µs)."""
    return _run_avx2(x, q, scales)


@_int8_matmul_avx2.register_fake
def _(x: Tensor, q: Tensor, scales: Tensor) -> Tensor:
    return x.new_empty(x.shape[0], q.shape[0])


def quantize_blocks(x: Tensor) -> tuple[Tensor, Tensor]:
    """``x`` (m, k), k a multiple of 32 -> its int8 values (m, k) and their block scales (m, k /
    32), ``x ≈ q · scale`` per block: ``q = round(x · 127 / max|block|)``, as the C kernel
    quantises activations (and :mod:`attnkit.models.weights` the weights)."""
    blocks = x.float().reshape(x.shape[0], -1, BLOCK)
    peak = blocks.abs().amax(dim=-1, keepdim=True)  # (m, k / 32, 1)
    inverse = torch.where(peak > 0, 127.0 / peak, torch.zeros_like(peak))
    q = torch.round(blocks * inverse).clamp_(-127, 127)
    return q.reshape(x.shape).to(torch.int8), (peak / 127.0).squeeze(-1)


def int8_matmul_reference(x: Tensor, q: Tensor, scales: Tensor) -> Tensor:
    """The kernel's arithmetic in PyTorch: ``x`` (m, k) fp32 quantised per block, times the
    int8 weights ``q`` (n, k) with their block ``scales`` (n, k / 32); (m, n) fp32. The integer
    dot products are exact (float64 holds them), the scaled block sums in fp32 as the kernel's."""
    xq, xd = quantize_blocks(x)
    dots = torch.einsum("mbi,nbi->mnb", xq.double().view(len(xq), -1, BLOCK), q.double().view(len(q), -1, BLOCK))
    return (dots.float() * (xd[:, None, :] * scales.float()[None])).sum(-1)


def int8_matmul(x: Tensor, q: Tensor, scales: Tensor, kernel: str = "auto") -> Tensor:
    """``x`` (m, k) fp32 times the int8 weights ``q`` (n, k) with one scale per block of 32,
    ``scales`` (n, k / 32) (:func:`quantize_blocks` of the weights), ``x`` quantised the same
    way: (m, n) fp32. ``kernel``: "avx2", "reference", or "auto" (AVX2 where it runs). k must be
    a multiple of 32 (pad both sides with zeros)."""
    if kernel != "reference" and torch.compiler.is_compiling():
        # The op, opaque to the graph: a model holds block scales only where the kernel runs.
        return _int8_matmul_avx2(x.float(), q, scales.float())
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r} is not an int8 kernel; use one of {', '.join(KERNELS)}")
    if x.shape[-1] % BLOCK or q.shape[-1] != x.shape[-1]:
        raise ValueError(f"x (…, {x.shape[-1]}) and q (…, {q.shape[-1]}) need one k, a multiple of {BLOCK}")
    if kernel == "auto":
        kernel = _auto()
    if kernel == "reference":
        return int8_matmul_reference(x, q, scales)
    return _run_avx2(x.float(), q, scales.float())  # a kernel that cannot run: its one-line error
