"""Training throughput at the demo's shape against an earlier commit of attnkit, side by side in
one run (issue: the main job, "≥ 1.5× today's target tokens/s for the same model").

``python -m benchmarks trainspeed --baseline REV``: the commit ``REV`` is exported into a
temporary directory, and the same short run — the same model, batches, precision and data —
trains there and here in turn, ``--repeats`` times each, every run in a fresh process. The
figure is the steady rate: target tokens per second over the logged steps after the first
``WARM`` ones (the first steps allocate and fill caches), the median over repeats. The
bf16 matmul peak measured in the same run gives the model-FLOPs utilisation of each side.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WARM = 20  # steps left out of the rate
# The model and batches both sides train: the translate-en-fr shape, fixed here so that a change
# of the preset does not change what is compared.
SHAPE = {
    "model.d_model": "256",
    "model.n_heads": "4",
    "model.d_ff": "1024",
    "model.n_layers": "3",
    "model.n_decoder_layers": "3",
    "model.dropout": "0.1",
    "model.norm_first": "false",
    "train.batch_tokens": "3072",
    "train.precision": "auto",
    "train.schedule": "noam",
    "train.lr": "0.5",
    "train.warmup": "400",
    "train.time_budget": "null",
    "train.checkpoint_every": "100000",
    "train.log_every": "10",
}


def _export(rev: str, into: Path) -> Path:
    """The tree of commit ``rev`` of this checkout, written into ``into``."""
    archive = into / "tree.tar"
    with archive.open("wb") as fh:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev], stdout=fh, check=True)
    tree = into / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def _train(tree: Path, steps: int, out: Path, changes: dict[str, str]) -> dict[str, float]:
    """One short run of ``tree``'s attnkit in a fresh process; its steady rate."""
    options = [f"--{k}={v}" for k, v in {**SHAPE, "train.max_steps": str(steps), **changes}.items()]
    command = [sys.executable, "-m", "attnkit", "train", "--preset", "translate-en-fr", "--out", str(out), "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([*command, *options], env=env, cwd=tree, check=True, capture_output=True)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steady = [r for r in records if r["split"] == "train" and r["step"] > WARM]
    tokens = sum(r["tokens_per_s"] * (r["seconds"] - p["seconds"]) for p, r in itertools.pairwise(steady))
    seconds = steady[-1]["seconds"] - steady[0]["seconds"]
    padding = [r["padding"] for r in steady if "padding" in r]  # an older tree does not log it
    return {"target_tokens_per_s": tokens / seconds, "padding": statistics.fmean(padding) if padding else None}


def run(baseline: str, steps: int = 80, repeats: int = 3, small: bool = False) -> dict[str, Any]:
    import torch

    from attnkit.config import apply_overrides, run_preset
    from attnkit.machine import machine
    from attnkit.models import build_model
    from benchmarks.training import matmul_peak, model_flops_per_token

    # --small: a quick check that it runs (a narrow model, few steps, one repeat)
    changes = {"model.d_model": "64", "model.d_ff": "128", "data.vocab_size": "1000"} if small else {}
    steps, repeats = (WARM + 30, 1) if small else (steps, repeats)
    rates: dict[str, list[float]] = {"baseline": [], "this": []}
    padding: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"baseline": _export(baseline, Path(tmp)), "this": ROOT}
        for i in range(repeats):
            for side, tree in trees.items():
                result = _train(tree, steps, Path(tmp) / f"{side}-{i}", changes)
                rates[side].append(result["target_tokens_per_s"])
                padding[side] = result["padding"]
    shape = apply_overrides(run_preset("translate-en-fr"), {k: v for k, v in (SHAPE | changes).items() if "." in k})
    vocab = int(changes.get("data.vocab_size", shape.data.vocab_size))
    flops = model_flops_per_token(build_model(shape.model.replace(vocab_size=vocab)), seq=40)  # verses: ~40 tokens
    peak = matmul_peak(repeats=3, dtype=torch.bfloat16)
    median = {side: statistics.median(r) for side, r in rates.items()}
    return {
        "baseline": baseline,
        "steps": steps,
        "shape": SHAPE | changes,
        "target_tokens_per_s": rates,
        "median": median,
        "ratio": median["this"] / median["baseline"],
        "padding": padding,
        "bf16_matmul_peak": peak,
        "mfu": {side: rate * flops / peak for side, rate in median.items()},
        "machine": machine(),
    }
