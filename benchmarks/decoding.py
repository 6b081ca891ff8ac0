"""Batch-1 decoding per weight format: GPT-2 124M (random weights) greedy, 64 new tokens after
a 16-token prompt, attnkit in fp32, bf16 and int8 (``from_pretrained(weights=...)``) against
``transformers`` fp32 on the same saved weights, side by side in one process; and the floor
each format implies on this machine: the bytes of weights one token reads over the measured
memory read bandwidth.

``python -m benchmarks decoding [--small] [--repeats N] [--out FILE]``. CTranslate2 is not in
this suite yet (issue 15): where it is installed it is the anchor to add.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch

import attnkit
from attnkit.machine import native_bf16
from benchmarks.common import Comparison, compare
from benchmarks.generation import _hf_options, _pair

PROMPT, NEW = 16, 64


def bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes per second read by a sum over a tensor far larger than the caches: the memory
    traffic that bounds one token of batch-1 decoding (each weight read once)."""
    data = torch.ones(megabytes * 2**20 // 4)
    data.sum()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - start)
    return data.numel() * 4 / statistics.median(times)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the matrices a decoded token reads: every parameter and buffer but the
    embedding tables, of which a token reads one row (the vocabulary projection is counted,
    as the head's own int8 copy or as the tied table)."""
    total = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    tables = [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    int8_head = getattr(model.head, "weight_int8", None) is not None
    lookups = sum(t.numel() * t.element_size() for t in tables)
    return total - lookups + (0 if int8_head else tables[0].numel() * tables[0].element_size())


def run(repeats: int = 5, small: bool = False) -> tuple[list[Comparison], dict[str, dict[str, float]]]:
    changes = dict(n_embd=64, n_layer=2, n_head=4) if small else {}
    reference, hf = _pair(changes)
    formats = ["fp32", "int8"] + (["bf16"] if native_bf16(torch.device("cpu")) else [])
    ids = torch.randint(0, hf.config.vocab_size, (1, PROMPT))
    per_second = bandwidth(64 if small else 512)
    results, floors = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        reference.save_pretrained(Path(tmp) / "model")
        for fmt in formats:
            ours = attnkit.from_pretrained(Path(tmp) / "model", weights=fmt)
            ours.config = ours.config.replace(eos_token_id=None)
            result = compare(
                f"GPT-2{' tiny' if small else ' 124M'} greedy, attnkit {fmt} (1×{PROMPT} + {NEW})",
                lambda ours=ours: ours.generate(ids, max_new_tokens=NEW),
                lambda: hf.generate(ids, max_new_tokens=NEW, **_hf_options()),
                work=NEW, peer_name="transformers fp32", repeats=repeats, warmup=1,
            )  # fmt: skip
            floor_ms = 1000 * weight_bytes(ours) / per_second
            ms = 1000 / result.rate(result.ours)
            result.notes.update(
                {"ms/token": ms, "floor ms/token": floor_ms, "% of the floor's speed": 100 * floor_ms / ms}
            )
            floors[fmt] = {"weight_bytes": weight_bytes(ours), "floor_ms": floor_ms, "ms_per_token": ms}
            results.append(result)
    floors["bandwidth_gb_s"] = {"value": per_second / 1e9}
    return results, floors
