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
