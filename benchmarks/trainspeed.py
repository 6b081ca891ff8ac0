"""Training throughput of the demo's model against an earlier commit of attnkit, side by side in
one run (issue 25: "the demo's fp32 training step at equal model: ≥ 1.5× today's target tokens/s").

``python -m benchmarks trainspeed --baseline REV [--precision fp32,bf16]``: the commit ``REV``
is exported into a temporary directory, and the same run — the same model, batches, recipe and
precision — trains there and here in turn, ``--repeats`` times each per precision, every run a
fresh ``attnkit train`` process, stopped by SIGTERM once it has logged enough steps (so no run
pays for the translation report at its end). The figure is the steady rate: target tokens per
second over the logged steps after the first ``WARM`` (they allocate and fill caches), the
median over repeats. Give bf16 a few hundred steps (the default, 300): oneDNN makes a bf16
kernel for each new batch shape the first time it meets it, and over the first hundred steps
that is most of them (2026-12-02: 4,031–5,725 target tokens/s over steps 21–100, one run to the
next). bf16 is measured only where the CPU computes it natively (elsewhere
``precision=auto`` trains in fp32, and emulated bf16 is no one's path). The matmul peak of each
precision, measured in the same run, gives each side's model-FLOPs utilisation.

To approximate an AVX2-only CPU's kernels on an AVX-512 machine, set ``ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`` for the whole command (both trees' runs
inherit it; the result's ``machine`` records the capability).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WARM = 20  # steps left out of the rate
# The demo's model and recipe (translate-en-fr of 2026-12-01), fixed here so that a change of
# the preset does not change what is compared; its explicit model options also keep a tree that
# fits the model to the machine from choosing another.
SHAPE = {
    "model.d_model": "256",
    "model.n_heads": "4",
    "model.d_ff": "1024",
    "model.n_layers": "3",
    "model.n_decoder_layers": "3",
    "model.dropout": "0",
    "model.norm_first": "true",
    "train.batch_tokens": "1024",
    "train.label_smoothing": "0",
    "train.schedule": "noam",
    "train.lr": "0.32",
    "train.warmup": "100",
    "train.time_budget": "null",
    "train.max_steps": "100000",
    "train.checkpoint_every": "100000",
    "train.log_every": "10",
}
# --small: a check that it runs, sized by work (a narrow model on number words), not by time.
SMALL = {
    "model.d_model": "64",
    "model.n_heads": "2",
    "model.d_ff": "128",
    "data.corpus": "numbers",
    "data.source": "en",
    "data.target": "de",
    "data.numbers": "3000",
    "data.vocab_size": "600",
    "data.max_tokens": "48",
    "train.log_every": "5",
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


def _train(tree: Path, steps: int, out: Path, changes: dict[str, str], timeout: float) -> dict[str, float | None]:
    """One run of ``tree``'s attnkit in a fresh process, stopped once it has logged ``steps``
    steps; its steady rate."""
    options = [f"--{k}={v}" for k, v in {**SHAPE, **changes}.items()]
    command = [sys.executable, "-m", "attnkit", "train", "--preset", "translate-en-fr", "--out", str(out), "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    child = subprocess.Popen([*command, *options], env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    try:
        while not any(r["split"] == "train" and r["step"] >= steps for r in _safe_records(out)):
            if child.poll() is not None:
                raise RuntimeError(
                    f"{tree}: the run exited ({child.returncode}): {child.stderr.read().decode()[-2000:]}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"{tree}: {steps} steps not logged within {timeout:.0f} s")
            time.sleep(0.5)
        child.send_signal(signal.SIGTERM)  # the trainer finishes its step, saves and exits
        child.wait(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    steady = [r for r in _safe_records(out) if r["split"] == "train" and WARM < r["step"] <= steps]
    tokens = sum(r["tokens_per_s"] * (r["seconds"] - p["seconds"]) for p, r in itertools.pairwise(steady))
    seconds = steady[-1]["seconds"] - steady[0]["seconds"]
    padding = [r["padding"] for r in steady if "padding" in r]  # an older tree does not log it
    return {"target_tokens_per_s": tokens / seconds, "padding": statistics.fmean(padding) if padding else None}


def _safe_records(out: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's records, without a last line the writer has not finished."""
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records


def run(
    baseline: str,
    steps: int = 300,
    repeats: int = 3,
    small: bool = False,
    precisions: tuple[str, ...] = ("fp32", "bf16"),
) -> dict[str, Any]:
    import torch

    from attnkit.config import apply_overrides, run_preset
    from attnkit.machine import machine, native_bf16
    from attnkit.models import build_model
    from benchmarks.training import matmul_peak, model_flops_per_token

    changes = SMALL if small else {}
    steps, repeats = (WARM + 15, 1) if small else (steps, repeats)
    skipped = {}
    if "bf16" in precisions and not native_bf16(torch.device("cpu")):
        precisions = tuple(p for p in precisions if p != "bf16")
        skipped["bf16"] = "this CPU does not compute bf16 natively: precision=auto trains in fp32 here"
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    rates: dict[str, dict[str, list[float]]] = {p: {"baseline": [], "this": []} for p in precisions}
    padding: dict[str, float | None] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"baseline": _export(baseline, Path(tmp)), "this": ROOT}
        for precision, i in itertools.product(precisions, range(repeats)):
            for side, tree in trees.items():
                out = Path(tmp) / f"{side}-{precision}-{i}"
                result = _train(tree, steps, out, {**changes, "train.precision": precision}, timeout=60 + 30 * steps)
                rates[precision][side].append(result["target_tokens_per_s"])
                padding[side] = result["padding"]
    shape = apply_overrides(run_preset("translate-en-fr"), {**SHAPE, **changes})
    vocab = int(shape.data.vocab_size)
    flops = model_flops_per_token(build_model(shape.model.replace(vocab_size=vocab)), seq=40)  # verses: ~40 tokens
    results = {}
    for precision in precisions:
        peak = matmul_peak(repeats=3, dtype=dtypes[precision])
        median = {side: statistics.median(r) for side, r in rates[precision].items()}
        results[precision] = {
            "target_tokens_per_s": rates[precision],
            "median": median,
            "ratio": median["this"] / median["baseline"],
            "matmul_peak": peak,
            "mfu": {side: rate * flops / peak for side, rate in median.items()},
        }
    return {
        "baseline": baseline,
        "steps": steps,
        "warm": WARM,
        "shape": {**SHAPE, **changes},
        "precisions": results,
        "skipped": skipped,
        "padding": padding,
        "machine": machine(),
        "load_after": os.getloadavg()[0],
    }
