"""The suite on one accelerator (issue: performance, "On a GPU"): bf16 matmul peak, GPT-2
124M training steps (bf16 autocast, fused SDPA) against ``transformers`` on identical weights
with their MFU against that peak, and attention memory of the math and fused paths as n grows.

``python -m benchmarks gpu [--small] [--device cuda] [--out FILE]``, or ``benchmarks/gpu.sh``,
which writes ``benchmarks/results/gpu-DATE.json``. ``--device cpu --small`` runs the same code on
a CPU (the test suite does, so the script is known to work before a GPU is at hand).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnkit.nn.attention import attention_fused, attention_math
from attnkit.objectives.base import token_loss
from benchmarks.common import Comparison, add_mfu, compare
from benchmarks.training import _gpt_pair, matmul_peak, model_flops_per_token, sync, train_step


def _timed(fn: Callable[[], object], device: torch.device) -> Callable[[], None]:
    """``fn`` followed by a device synchronisation, so that wall time covers the work."""

    def call() -> None:
        fn()
        sync(device)

    return call


def training(device: torch.device, small: bool, repeats: int, peak: float) -> Comparison:
    """GPT-2 124M (or a tiny GPT when small) train steps, bf16 autocast, AdamW, identical weights."""
    d_model, layers, vocab, batch, seq = (128, 2, 1000, 2, 128) if small else (768, 12, 50257, 8, 1024)
    ours, hf = (m.to(device) for m in _gpt_pair(d_model, layers, vocab, seq))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    opt_ours, opt_hf = (torch.optim.AdamW(m.parameters(), lr=1e-4, fused=device.type == "cuda") for m in (ours, hf))
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)

    def ours_loss(m: torch.nn.Module) -> torch.Tensor:
        with autocast:
            return token_loss(m(ids).logits[:, :-1].float(), labels).total / labels.numel()

    def hf_loss(m: torch.nn.Module) -> torch.Tensor:
        with autocast:
            return m(ids, labels=ids).loss

    labels = ids[:, 1:]
    result = compare(
        f"GPT-2-shaped d={d_model} N={layers} train step, bf16 ({batch}×{seq})",
        _timed(lambda: train_step(ours, opt_ours, ours_loss), device),
        _timed(lambda: train_step(hf, opt_hf, hf_loss), device),
        work=batch * seq, peer_name="transformers", repeats=repeats,
    )  # fmt: skip
    return add_mfu(result, model_flops_per_token(ours, seq), peak)


def attention_memory(device: torch.device, small: bool) -> dict[int, dict[str, float]]:
    """Peak bytes one causal self-attention call needs on each path (CUDA's allocator counts)."""
    if device.type != "cuda":
        return {}
    table: dict[int, dict[str, float]] = {}
    for n in (1024, 4096) if small else (1024, 4096, 16384):
        q, k, v = (torch.randn(1, 8, n, 64, device=device, dtype=torch.bfloat16) for _ in range(3))
        table[n] = {}
        for name, fn in (("math", attention_math), ("fused", attention_fused)):
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            with torch.no_grad():
                fn(q, k, v, is_causal=True)
            torch.cuda.synchronize(device)
            table[n][name] = torch.cuda.max_memory_allocated(device) - before
    return table


def run(device: str = "cuda", small: bool = False, repeats: int = 10) -> dict:
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run the CPU suites instead (python -m benchmarks training)")
    torch.manual_seed(0)
    peak = matmul_peak(n=1024 if small else 8192, repeats=3 if small else 20, dtype=torch.bfloat16, device=dev)
    result = training(dev, small, repeats, peak)
    return {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "bf16_matmul_peak": peak,
        "training": result,
        "attention_peak_bytes": attention_memory(dev, small),
    }
