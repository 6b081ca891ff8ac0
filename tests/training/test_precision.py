"""train.precision: bf16 autocast trains, "auto" picks bf16 only where it is native, fp16 needs a GPU."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from attnkit.config import apply_overrides, run_preset
from attnkit.training.distributed import native_bf16, resolve_precision
from attnkit.training.run import train


def test_auto_is_bf16_exactly_where_it_is_native() -> None:
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == ("bf16" if native_bf16(cpu) else "fp32")
    assert resolve_precision("fp32", cpu) == "fp32" and resolve_precision("bf16", cpu) == "bf16"


def test_fp16_on_a_cpu_is_refused() -> None:
    with pytest.raises(ValueError, match="fp16 needs a CUDA device"):
        resolve_precision("fp16", torch.device("cpu"))


def test_a_bad_cpu_class_is_refused_on_a_gpu_too() -> None:
    # Checked before the device is asked anything: a machine with a GPU refuses it as one without.
    with pytest.raises(ValueError, match=r"train\.cpu_class='avx3' is not a CPU class"):
        resolve_precision("auto", torch.device("cuda"), "avx3")


def test_bf16_autocast_trains(tmp_path: Path, corpus: Path) -> None:
    run = apply_overrides(
        run_preset("gpt-tiny"),
        {"data.path": str(corpus), "data.vocab_size": "400", "train.batch_tokens": "1024", "train.max_steps": "3",
         "train.warmup": "1", "train.lr": "3e-3", "train.precision": "bf16", "train.eval_every": "0"},
    )  # fmt: skip
    _, final = train(run, tmp_path / "r", progress_bar=False)
    assert math.isfinite(final["loss"])
