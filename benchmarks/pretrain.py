"""Each family's own pretraining on all the Bible text attnkit reads [sec:att-families]: BERT's
masked LM, GPT's causal LM and T5's span corruption, on every public-domain translation of
:data:`attnkit.data.corpora.BIBLES` (four languages; GPT leaves Italian out, :data:`HELD_OUT`,
for its held-out-language check), counted in updates so that the losses
do not depend on the machine's load (its seconds do: run it on a quiet machine)::

    python -m benchmarks pretrain --family bert|gpt|t5 [--steps N] [--dir DIR] [--small]

The run trains into ``--dir`` (default ``runs/pretrain/FAMILY``) and resumes there, bitwise, when
stopped and started again. Fine-tuning reads it by its directory:
``attnkit train --preset minilm-testament --train.init=runs/pretrain/bert ...``
(``python -m benchmarks fewlabels`` does, for every label count). Its curve, configuration and
machine go to ``--out`` (default benchmarks/results): ``pretrain-FAMILY.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from attnkit.config import RunConfig, apply_overrides, run_preset
from attnkit.data.corpora import BIBLES
from attnkit.models.run_dir import RUN_CONFIG, checkpoint_step, latest_checkpoint
from attnkit.training.run import train
from benchmarks.common import machine

RESULTS = Path(__file__).parent / "results"
PRESETS = {"bert": "bert-bible", "gpt": "gpt-bible", "t5": "t5-bible"}
# Updates per family: about an hour each on a 2-core AVX512-BF16 CPU at 4,096-token batches.
STEPS = {"bert": 3000, "gpt": 3000, "t5": 3000}
# T5 pretrains at the rate, warm-up and dropout its tasks' preset trains at (docs/families.md's
# recipe study), so that fine-tuning does not start from weights fitted to another recipe.
_T5_RECIPE = {"train.lr": "3e-2", "train.warmup": "100", "model.dropout": "0.0"}
# Bibles a family's pretraining leaves out: GPT's held-out-language check fine-tunes on a few
# verses of Diodati's Italian, which its pretraining (and tokenizer) must never have read.
HELD_OUT = {"gpt": ("d",)}
_TINY = {"model.d_model": "64", "model.n_heads": "4", "model.d_ff": "128", "model.n_layers": "2"}


def config(family: str, steps: int, small: bool = False) -> RunConfig:
    """The family's pretraining run: its Bible preset on every translation, a cosine decay over
    ``steps`` updates, a vocabulary large enough for four languages, validation loss every
    tenth of the run."""
    every = max(steps // 10, 1)
    overrides = {
        "data.bibles": ",".join(c for c in BIBLES if c not in HELD_OUT.get(family, ())), "data.vocab_size": "12000",
        "train.max_steps": str(steps), "train.time_budget": "null", "train.schedule": "cosine",
        "train.precision": "auto", "train.eval_every": str(every), "train.checkpoint_every": str(every),
        "train.log_every": str(max(every // 5, 1)), "train.keep_checkpoints": "2",
        **(_T5_RECIPE if family == "t5" else {}),
        **({**_TINY, "data.vocab_size": "1000", "data.bibles": "4", "train.eval_batches": "2"} if small else {}),
        **({"model.d_k": "16"} if small and family == "t5" else {}),
    }  # fmt: skip
    return apply_overrides(run_preset(PRESETS[family]), overrides)


def curve(run_dir: Path) -> dict[str, list[tuple[int, float, float]]]:
    """(update, seconds of training, loss) of the run's training log and of its validation
    evaluations (an evaluation's seconds are those of the update before it)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    seconds = {r["step"]: r["seconds"] for r in records if r["split"] == "train"}
    return {
        split: [(r["step"], seconds.get(r["step"], float("nan")), r["loss"])
                for r in records if r["split"] == split and not r.get("final")]
        for split in ("train", "valid")
    }  # fmt: skip


def run(family: str, steps: int, run_dir: Path, small: bool = False) -> dict[str, Any]:
    """Pretrain (or resume) into ``run_dir``; the curve and what the run was. A run stopped
    before its first checkpoint starts again from update 0 (its metrics trimmed)."""
    cfg = config(family, steps, small)
    last = latest_checkpoint(run_dir)
    done, final = train(cfg, run_dir, resume=(run_dir / RUN_CONFIG).is_file(), progress_bar=False)
    return {
        "family": family, "run_dir": str(run_dir), "updates": done.step, "seconds": done.seconds,
        "from_update": 0 if last is None else checkpoint_step(last),
        "tokens": done.tokens, "valid_loss": final["loss"], "curve": curve(run_dir),
        "config": json.loads((run_dir / "run.json").read_text(encoding="utf-8")),
    }  # fmt: skip


def earlier_calls(path: Path, run_dir: Path, from_update: int) -> list[dict[str, Any]]:
    """The calls that trained ``run_dir`` before this one, from the result it wrote at ``path``
    (a run that starts afresh has none): each call's date, updates, load and seconds, so that a
    resumed run's record says where each stretch ran."""
    if from_update == 0 or not path.is_file():
        return []
    old = json.loads(path.read_text(encoding="utf-8"))
    if old.get("run_dir") != str(run_dir):
        return []
    return old["calls"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks pretrain", description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=sorted(PRESETS), required=True)
    parser.add_argument("--steps", type=int, help="updates (default: STEPS, per family)")
    parser.add_argument("--dir", type=Path, help="the run directory (default runs/pretrain/FAMILY)")
    parser.add_argument("--small", action="store_true", help="a tiny model on one Bible (a quick check that it runs)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory (default benchmarks/results)")
    args = parser.parse_args(argv)
    steps = STEPS[args.family] if args.steps is None else args.steps
    if steps < 1:
        parser.error(f"--steps must be >= 1, got {steps}")
    run_dir = args.dir or Path("runs") / "pretrain" / (args.family + ("-small" if args.small else ""))
    load_before, started = os.getloadavg()[0], time.perf_counter()
    result = {**run(args.family, steps, run_dir, args.small), "machine": machine()}
    call = {"date": result["machine"]["date"], "from_update": result.pop("from_update"),
            "to_update": result["updates"], "load_before": load_before, "load_after": os.getloadavg()[0],
            "wall_seconds": time.perf_counter() - started}  # fmt: skip
    path = args.out / (f"pretrain-{args.family}" + ("-small" if args.small else "") + ".json")
    result["calls"] = [*earlier_calls(path, run_dir, call["from_update"]), call]
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"{args.family}: {result['updates']:,} updates, {result['seconds']:.0f} s, validation loss "
          f"{result['valid_loss']:.3f} -> {run_dir}")  # fmt: skip
    return 0
