"""Building attnkit's C kernels: ``blocks.c`` (with ``blocks_avx2.h`` or ``blocks_neon.h``, the
machine's instructions) compiled at first use with the system's C compiler (``$CC``, else ``cc``:
the compiler inductor needs too) and loaded with ``ctypes``; and the same C code linked with the
op's C++ kernel (``blocks_op.cpp``, ``$CXX`` else ``c++``, the torch headers), which the
dispatcher calls without entering Python. Each library is built once per source, flags and torch
version into ``$XDG_CACHE_HOME/attnkit/kernels`` (else ``~/.cache/...``), written atomically; a
kernel that cannot be built says why in one line (:class:`KernelUnavailableError`), remembered so
the build is not tried again. The products themselves, and the op, are :mod:`attnkit.kernels.ops`."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from attnkit.machine import cpu_flags

SOURCE = Path(__file__).with_name("blocks.c")
HEADERS = tuple(SOURCE.with_name(f"blocks_{kernel}.h") for kernel in ("avx2", "neon"))  # included by SOURCE
OP_SOURCE = Path(__file__).with_name("blocks_op.cpp")
FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=c11")
KERNELS = ("auto", "avx2", "neon", "reference")
# Each C kernel: its name in messages, the CPUs it runs on and the CPU flags it needs (none on
# ARM64: AArch64 always has NEON, and a machine without /proc/cpuinfo, a Mac, lists no flags).
TITLES = {"avx2": "AVX2", "neon": "NEON"}
ARCHITECTURES = {"avx2": "x86-64", "neon": "ARM64"}
FEATURES = {"avx2": frozenset({"avx2", "fma", "f16c"}), "neon": frozenset()}
# From this many activation rows on (a batch, beams, a prompt), a product of unpacked blocks
# dequantises them and multiplies dense in fp32: at 32 rows that wins over the integer dot
# products on every shape measured, at 16 it loses on most. Packed blocks stay integer at every
# row count: they beat fp32 itself from 1 to 2,048 rows (4-bit; q8_0 from 1 to 512 measured:
# `python -m benchmarks blocks`, docs/performance.md). Only rows beyond a weight's last group of
# 8 are ever unpacked.
DENSE_ROWS = 32


def native() -> str:
    """The C kernel for this machine's architecture: "neon" on ARM64, else "avx2"."""
    return "neon" if platform.machine().lower() in ("aarch64", "arm64") else "avx2"


def isa_flags(kernel: str, flags: frozenset[str]) -> tuple[str, ...]:
    """The compiler flags for ``kernel``'s instructions on a CPU with ``flags``: ARMv8.2's dot
    products where the CPU has them (``asimddp``), else plain ARMv8's."""
    if kernel == "avx2":
        return ("-mavx2", "-mfma", "-mf16c")
    return ("-march=armv8.2-a+dotprod",) if "asimddp" in flags else ("-march=armv8-a",)


def source_bytes() -> bytes:
    return b"".join(path.read_bytes() for path in (SOURCE, *HEADERS))


class KernelUnavailableError(RuntimeError):
    """A kernel asked for by name that this machine cannot build or run."""


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "attnkit" / "kernels"


def compiled(name: str, sources: bytes, commands: Sequence[Sequence[str]]) -> Path | str:
    """The library ``name`` built in the cache by ``commands`` (each with ``{out}`` for the
    library and ``{dir}`` for a scratch folder), once per ``sources`` and commands; or why not,
    in one line."""
    digest = hashlib.sha256(sources + repr(commands).encode()).hexdigest()[:16]
    target = cache_dir() / f"{name}-{digest}.so"
    try:
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
                built = Path(scratch) / target.name
                for command in commands:
                    line = [part.format(out=built, dir=scratch) for part in command]
                    done = subprocess.run(line, capture_output=True, text=True)
                    if done.returncode != 0:
                        errors = [text for text in done.stderr.splitlines() if "error" in text] or ["no message"]
                        return f"did not compile with {command[0]}: {errors[0].strip()}"
                os.replace(built, target)  # atomic: a concurrent build writes the same file
    except OSError as err:
        return f"cannot be built in {target.parent} ({err})"
    return target


def find_compiler(variable: str, default: str) -> str | None:
    compiler = os.environ.get(variable, default)
    return compiler if shutil.which(compiler) else None


def flags() -> tuple[str, ...]:
    """The compiler flags of this machine's C kernel."""
    return (*FLAGS, *isa_flags(native(), cpu_flags()))


@functools.cache
def c_library() -> ctypes.CDLL | KernelUnavailableError:
    title = TITLES[native()]
    missing = FEATURES[native()] - cpu_flags()
    if missing:
        needs = ", ".join(sorted(missing))
        return KernelUnavailableError(f"the {title} block kernel needs {needs}, which this CPU lacks")
    compiler = find_compiler("CC", "cc")
    if compiler is None:
        return KernelUnavailableError(
            f"the {title} block kernel is compiled at first use and there is no C compiler "
            f"({os.environ.get('CC', 'cc')!r}); install one (e.g. apt-get install gcc) or set CC"
        )
    target = compiled(f"blocks-{native()}", source_bytes(), [[compiler, *flags(), str(SOURCE), "-o", "{out}"]])
    if isinstance(target, str):
        return KernelUnavailableError(f"the {title} block kernel {target}")
    try:
        library = ctypes.CDLL(str(target))
    except OSError as err:
        return KernelUnavailableError(f"the {title} block kernel cannot be loaded from {target} ({err})")
    library.attnkit_block_matmul.restype = library.attnkit_block_dequantize.restype = ctypes.c_int
    arrays = [ctypes.c_void_p] * 5  # the weights' data, scales, minima and row counts; the output
    int64 = ctypes.c_int64
    # ... and the packed groups, between the minima and the row counts
    matmul = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, *arrays[:3], *arrays[2:], int64, int64]
    library.attnkit_block_matmul.argtypes = matmul
    library.attnkit_block_dequantize.argtypes = [ctypes.c_int, ctypes.c_int, *arrays, int64]
    return library


def op_library() -> Path | str:
    """``blocks.c`` and ``blocks_op.cpp`` linked into one library, the op's C++ kernel; or
    why it cannot be built, in one line."""
    compiler, linker = find_compiler("CC", "cc"), find_compiler("CXX", "c++")
    if compiler is None or linker is None:
        return f"there is no C++ compiler ({os.environ.get('CXX', 'c++')!r})"
    from torch.utils import cpp_extension

    torch_lib = cpp_extension.library_paths()[0]
    cpp = [
        linker, "-O2", "-std=c++20", "-fPIC", "-shared", "-fopenmp", f"-DATTNKIT_DENSE_ROWS={DENSE_ROWS}",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        *(f"-I{path}" for path in cpp_extension.include_paths()),
        str(OP_SOURCE), "{dir}/blocks.o", f"-L{torch_lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{torch_lib}",
        "-o", "{out}",
    ]  # fmt: skip
    c = [compiler, *(flag for flag in flags() if flag != "-shared"), "-c", str(SOURCE), "-o", "{dir}/blocks.o"]
    sources = source_bytes() + OP_SOURCE.read_bytes() + torch.__version__.encode()
    return compiled(OP_SOURCE.stem, sources, [c, cpp])
