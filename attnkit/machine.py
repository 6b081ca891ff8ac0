"""The machine attnkit runs on: the CPU class that decides what is fast (bf16 or fp32), and a
description of it for reports and benchmark results.

A CPU class names what a CPU computes natively, from the flags in ``/proc/cpuinfo``:

* ``avx512-bf16``: AVX-512 with bf16 dot products (AVX512-BF16 or AMX): bf16 matrix products
  run at about twice fp32's rate, so training autocasts to bf16 and the bf16/int8 weight
  formats are fast;
* ``avx512``: AVX-512 without bf16; ``avx2``: AVX2 and FMA without AVX-512 (most laptops'
  CPUs, AMD Zen 2/3, many cloud VMs); ``x86-64``: neither — on all three bf16 is emulated,
  slower than fp32, so fp32 it is;
* ``arm64``: 64-bit ARM (treated as without native bf16).

``ATTNKIT_CPU_CLASS`` (or ``train.cpu_class``) makes attnkit act as on a smaller class than
the CPU's — ``avx2`` on an AVX512-BF16 machine takes every fp32 path — so those paths are
tested on any machine. It changes attnkit's choices, not PyTorch's kernels: to approximate an
AVX2 CPU's kernels too, also set ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
MKL_ENABLE_INSTRUCTIONS=AVX2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2`` before starting Python (the last
for the int8 GEMM of many rows, :mod:`attnkit.kernels.gemm`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

CPU_CLASS_ENV = "ATTNKIT_CPU_CLASS"
# x86 classes from the least to the most a CPU computes natively; a class can only be lowered.
X86_CLASSES = ("x86-64", "avx2", "avx512", "avx512-bf16")
CPU_CLASSES = (*X86_CLASSES, "arm64")
_NAMES = {
    "avx512-bf16": "AVX512-BF16",
    "avx512": "AVX-512 without native bf16",
    "avx2": "AVX2 without native bf16",
    "x86-64": "x86-64 without AVX2",
    "arm64": "ARM64 (bf16 not used)",
}


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (``flags`` on x86, ``Features`` on ARM); empty where unreadable."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def detected_cpu_class() -> str:
    """The class of this machine's CPU, from its flags (see the module docstring)."""
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "arm64"
    flags = cpu_flags()
    if "avx512_bf16" in flags or "amx_bf16" in flags:
        return "avx512-bf16"
    if "avx512f" in flags:
        return "avx512"
    if "avx2" in flags and "fma" in flags:
        return "avx2"
    return "x86-64"


@dataclass(frozen=True)
class CpuClass:
    """The CPU class attnkit acts on (``name``), the CPU's own (``detected``), and what set
    the first when they differ (``forced_by``: "ATTNKIT_CPU_CLASS" or "train.cpu_class")."""

    name: str
    detected: str
    forced_by: str | None = None

    @property
    def native_bf16(self) -> bool:
        return self.name == "avx512-bf16"

    def describe(self) -> str:
        """E.g. "AVX2 without native bf16 (forced by ATTNKIT_CPU_CLASS; the CPU is AVX512-BF16)"."""
        text = _NAMES[self.name]
        if self.forced_by is not None:
            text += f" (forced by {self.forced_by}; the CPU is {_NAMES[self.detected]})"
        return text


def lower_classes(detected: str) -> tuple[str, ...]:
    """The classes a CPU of class ``detected`` can act as: itself and the x86 classes below it."""
    if detected not in X86_CLASSES:
        return (detected,)
    return tuple(reversed(X86_CLASSES[: X86_CLASSES.index(detected) + 1]))


def cpu_class(requested: str = "auto") -> CpuClass:
    """The class attnkit acts on: ``requested`` (``train.cpu_class``) unless it is "auto", else
    ``$ATTNKIT_CPU_CLASS`` when set, else this CPU's. A class above the CPU's, or on another
    architecture, is refused: it would promise kernels the CPU does not have."""
    detected = detected_cpu_class()
    forced_by = None
    if requested != "auto":
        forced_by, name = "train.cpu_class", requested
    elif os.environ.get(CPU_CLASS_ENV, "auto").strip() not in ("", "auto"):
        forced_by, name = CPU_CLASS_ENV, os.environ[CPU_CLASS_ENV].strip()
    else:
        return CpuClass(detected, detected)
    setting = f"{forced_by}={name!r}" if forced_by != CPU_CLASS_ENV else f"{CPU_CLASS_ENV}={name}"
    if name not in CPU_CLASSES:
        raise ValueError(f"{setting} is not a CPU class; use auto or one of {', '.join(reversed(CPU_CLASSES))}")
    allowed = lower_classes(detected)
    if name not in allowed:
        raise ValueError(
            f"{setting} is not what this CPU can act as: it is {detected}, and a class can only be lowered "
            f"(to test a smaller CPU's paths); use auto or one of {', '.join(allowed)}"
        )
    return CpuClass(name, detected, forced_by if name != detected else None)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bf16 natively (CUDA with bf16, or a CPU of class
    avx512-bf16 as :func:`cpu_class` sees it), so that bf16 speeds work up rather than
    emulating it."""
    if device.type == "cuda":
        import torch

        return torch.cuda.is_bf16_supported()
    return cpu_class().native_bf16


# The flags that decide which kernels are fast, recorded with every measurement.
_FLAGS_THAT_MATTER = frozenset(
    {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx_vnni",
     "amx_bf16", "amx_int8", "amx_tile", "asimd", "asimddp", "bf16", "i8mm", "sve"}
)  # fmt: skip

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory(threshold: int = 256 * 2**20) -> bool:
    """Ask glibc's malloc to keep freed blocks of up to ``threshold`` bytes for reuse instead
    of handing them back to the kernel; returns whether it agreed (False off glibc).

    PyTorch's CPU tensors come straight from malloc, and a decoding step allocates the same
    large tensors (logits, a cache copy) again and again. Past glibc's 128 KB-32 MB threshold
    each one is a fresh mapping whose pages fault in on first touch: measured here, a 16 MB
    float32 tensor cost up to 11 ms that way, and a batch-32 beam-4 decode of a 6+6-layer
    d512 translator ran 18% faster with this set, and the demo's fp32 training step stopped
    taking up to 28,000 page faults. It is process-wide, so the library never sets it by
    itself: the training and inference commands of the CLI (its own process) do.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold)) and bool(mallopt(_M_TRIM_THRESHOLD, 2 * threshold))


def release_freed_memory() -> bool:
    """Hand the blocks malloc keeps free back to the kernel, once (glibc's ``malloc_trim``);
    returns whether it could (False off glibc). For the end of a load under
    :func:`keep_freed_memory`: the load's transient copies (a GGUF file dequantised, a format's
    check holding the model twice) would otherwise stay resident for the process's life
    (SmolLM2 GGUF with ``--weights auto``: 2.65 GB resident after the load, 0.63 GB after this)."""
    import ctypes
    import ctypes.util

    try:
        return bool(ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0))
    except (OSError, AttributeError, TypeError):
        return False


COMPILE_CACHE_ENV = "ATTNKIT_COMPILE_CACHE"
_set_here: set[str] = set()  # the cache directories this process chose for inductor


def cpu_identity() -> str:
    """The CPU as compiled code depends on it: its model, the flags that decide kernels, and a
    forced ``ATEN_CPU_CAPABILITY``."""
    capability = os.environ.get("ATEN_CPU_CAPABILITY", "")
    return f"{_cpu_model()}|{','.join(sorted(cpu_flags() & _FLAGS_THAT_MATTER))}|{capability}"


@functools.cache
def code_identity() -> str:
    """A hash of attnkit's Python source (each file's path and bytes): what was made from it and
    kept on the disk (a compiled step, a prepared model) is keyed by it."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def compile_cache() -> str | None:
    """Point inductor's on-disk cache (its compiled graphs, kernels and autotuning choices) at
    attnkit's cache on this machine, so that a step compiled once loads in later processes:
    ``$ATTNKIT_COMPILE_CACHE`` (default ``~/.cache/attnkit/compile``), one directory per torch
    version, CPU (its model name and the flags that decide kernels) and forced
    ``ATEN_CPU_CAPABILITY``. Keyed by the CPU because inductor's own key does not hold every
    part of it: a graph compiled under ``ATEN_CPU_CAPABILITY=avx2`` and reloaded by a process
    without it corrupted the heap here (``malloc(): unaligned tcache chunk detected``, torch
    2.13; a fresh cache compiled the same graph cleanly). A directory the user chose
    (``TORCHINDUCTOR_CACHE_DIR``, other than inductor's default) stands; one that cannot be
    written gives way to a temporary one for this process, with one line in the log. Called
    before each of attnkit's compiles (the decoding step, ``train.compile``); returns the
    directory set, or None."""
    import hashlib
    import tempfile

    import torch

    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current not in (None, *_set_here) and current != _inductor_default():
        return None
    capability = os.environ.get("ATEN_CPU_CAPABILITY", "")
    cpu = cpu_identity()
    root = os.environ.get(COMPILE_CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "attnkit", "compile")
    name = f"torch-{torch.__version__}-{capability or 'native'}-{hashlib.sha256(cpu.encode()).hexdigest()[:12]}"
    path = os.path.join(root, name)
    if current == path:
        return path
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as error:
        if current in _set_here:  # a temporary one already stands in for it
            return current
        path = tempfile.mkdtemp(prefix="attnkit-compile-")
        logging.getLogger("attnkit").warning(
            "the compile cache %s cannot be written (%s); compiling in %s for this process only: set %s to a "
            "writable directory to keep compiled steps between runs",
            root, error.strerror or error, path, COMPILE_CACHE_ENV,
        )  # fmt: skip
    _set_here.add(path)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    return path


def _inductor_default() -> str:
    """inductor's own default cache directory (importing inductor for it takes a second: only
    where ``TORCHINDUCTOR_CACHE_DIR`` is set and must be compared with it)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return os.path.abspath(default_cache_dir())


# The settings that make one CPU run another class's kernels (the benchmarks' forced AVX2 path).
FORCING = (
    "ATTNKIT_CPU_CLASS", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
    "FBGEMM_ENABLE_INSTRUCTIONS", "CT2_FORCE_CPU_ISA", "ATTNKIT_INT8_GEMM",
)  # fmt: skip


def machine() -> dict[str, object]:
    """Date, CPU model, class and flags that matter, core count, torch's thread count, version
    and kernel capability, the settings that force kernels (:data:`FORCING`) where set, and the
    GPU if any."""
    import torch

    cpu = cpu_class()
    about: dict[str, object] = {
        "date": date.today().isoformat(),
        "platform": platform.platform(),
        "processor": _cpu_model(),
        "cpu_class": cpu.name,
        "cpu_class_detected": cpu.detected,
        "cpu_flags": sorted(cpu_flags() & _FLAGS_THAT_MATTER),
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    forced = {name: os.environ[name] for name in FORCING if os.environ.get(name)}
    if forced:
        about["env"] = forced
    if torch.cuda.is_available():
        about["gpu"] = torch.cuda.get_device_name()
    return about
