"""A description of the machine a measurement ran on, for reports and benchmark results."""

from __future__ import annotations

import os
import platform
from datetime import date

import torch


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
    """Whether ``device`` computes bf16 natively (CUDA with bf16, or an x86 CPU with AVX512-BF16
    or AMX), so that bf16 autocast speeds training up rather than emulating it."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        flags = open("/proc/cpuinfo", encoding="utf-8").read()  # noqa: SIM115
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory(threshold: int = 256 * 2**20) -> bool:
    """Ask glibc's malloc to keep freed blocks of up to ``threshold`` bytes for reuse instead
    of handing them back to the kernel; returns whether it agreed (False off glibc).

    PyTorch's CPU tensors come straight from malloc, and a decoding step allocates the same
    large tensors (logits, a cache copy) again and again. Past glibc's 128 KB-32 MB threshold
    each one is a fresh mapping whose pages fault in on first touch: measured here, a 16 MB
    float32 tensor cost up to 11 ms that way, and a batch-32 beam-4 decode of a 6+6-layer
    d512 translator ran 18% faster with this set. It is process-wide, so the library never
    sets it by itself: the inference commands of the CLI (its own process) do.
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


def machine() -> dict[str, object]:
    """Date, CPU model and core count, torch's thread count and version, and the GPU if any."""
    about: dict[str, object] = {
        "date": date.today().isoformat(),
        "platform": platform.platform(),
        "processor": _cpu_model(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    if torch.cuda.is_available():
        about["gpu"] = torch.cuda.get_device_name()
    return about
