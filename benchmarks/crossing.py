"""Where a family's own pretraining starts to pay [sec:att-families]: T5's span corruption on
the Bibles, then its text-to-text tasks, against the tasks alone; BERT's masked LM, then the
Testament classifier, against the classifier from random weights. Each arm is a validation-loss
curve over total training seconds; the pretrained one starts where its pretraining ended.
``attnkit figures --only transfer`` compares the arms at one equal total; this gives every
total at once, and the budget at which the curves cross, if they do.

Every run is counted in updates (``--pretrain``, ``--tasks``, ``--alone``), so that load on
the machine changes its seconds but not its updates or losses; measure on a quiet machine for
seconds that mean anything. Each checkpoint is scored once training is over, so that no
evaluation is on the clock. The defaults (:data:`DEFAULTS`) are each family's updates for about
300 + 600 s against 900 s (T5) and 150 + 150 s against 300 s (BERT) on a 2-core AVX512-BF16 CPU::

    python -m benchmarks crossing [--family t5|bert] [--pretrain N] [--tasks N] [--alone N] [--every N] [--small]

Results go to ``--out`` (default benchmarks/results): ``crossing-FAMILY.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from attnkit.chapter.transfer import SCORED, bert_runs, classifier_scores, t5_runs, task_scores
from attnkit.config import RunConfig
from attnkit.data.prepare import Data, load_data
from attnkit.models import load_saved
from attnkit.models.run_dir import checkpoint_step, complete_checkpoints
from attnkit.training.evaluate import evaluate
from attnkit.training.run import make_objective, train
from benchmarks.common import machine

RESULTS = Path(__file__).parent / "results"
Curve = list[tuple[float, int, float]]  # (training seconds, update, validation loss)
FAMILIES = {  # family -> (its pretraining and arms, the score of a trained arm, the task's name)
    "t5": (t5_runs, lambda small: lambda run_dir, run: {"tasks": task_scores(run_dir, run, SCORED[small])},
           "span corruption, then the text-to-text tasks, against the tasks alone"),
    "bert": (bert_runs, lambda small: classifier_scores,
             "masked LM, then the Testament classifier, against it from random weights"),
}  # fmt: skip
# family -> updates of (pretraining, the task after it, the task alone, between checkpoints). On a
# 2-core AVX512-BF16 CPU span corruption's 4,096-token batches take 0.94 s an update, T5's tasks'
# 1,024-token batches 0.26 s, BERT's masked LM and classifier about 0.9 and 0.8 s.
DEFAULTS = {"t5": (320, 2328, 3492, 250), "bert": (160, 170, 370, 25)}


def _steps(updates: int, every: int, small: bool) -> dict[str, str]:
    """``updates`` counted, with a checkpoint every ``every`` updates (each scored once training
    is over, so that no evaluation is on the clock) and the training log, with its seconds, at
    the same updates. A time budget too large to bind leaves a budget schedule decaying over the
    updates."""
    return {
        "train.max_steps": str(updates), "train.time_budget": "1e9", "train.eval_every": "0",
        "train.log_every": str(every), "train.checkpoint_every": str(every), "train.keep_checkpoints": "100000",
        **({"train.eval_batches": "2"} if small else {}),
    }  # fmt: skip


def curve(run_dir: Path, run: RunConfig, data: Data) -> Curve:
    """(training seconds, update, validation loss) at each checkpoint of a finished run: the
    seconds from its metrics.jsonl, the loss over the run's validation batches."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    seconds = {r["step"]: r["seconds"] for r in records if r["split"] == "train"}
    objective = make_objective(run, data.specials)
    points = []
    for path in complete_checkpoints(run_dir):
        step = checkpoint_step(path)
        if step in seconds:
            points.append((seconds[step], step, evaluate(load_saved(path), objective, data.valid, run)["loss"]))
    return points


def crossing(pretrained: Curve, alone: Curve, offset: float) -> float | None:
    """The first total of seconds at which the pretrained curve (its seconds after ``offset``
    of pretraining) is below the curve of the tasks alone, both linear between their points;
    None when it never is where both are measured."""
    points = [(offset + s, loss) for s, _, loss in pretrained]

    def at(curve: list[tuple[float, float]], t: float) -> float | None:
        for (t0, y0), (t1, y1) in itertools.pairwise(curve):
            if t0 <= t <= t1:
                return y0 + (y1 - y0) * (t - t0) / max(t1 - t0, 1e-12)
        return None

    other = [(s, loss) for s, _, loss in alone]
    times = sorted({t for t, _ in points} | {t for t, _ in other})
    gaps = [(t, a - b) for t in times if (a := at(points, t)) is not None and (b := at(other, t)) is not None]
    if gaps and gaps[0][1] < 0:  # below from the first second both are measured at
        return gaps[0][0]
    for (t0, g0), (t1, g1) in itertools.pairwise(gaps):
        if g0 >= 0 > g1:  # pretrained above, then below: where the difference is zero
            return t0 + (t1 - t0) * g0 / (g0 - g1)
    return None


def run(family: str, pretrain: int, tasks: int, alone: int, every: int, small: bool, seed: int = 0) -> dict[str, Any]:
    """Pretrain for ``pretrain`` updates, then the task from it for ``tasks`` updates, and the
    task alone for ``alone`` (for equal totals, as many as take the other arm's seconds); each
    arm is scored on its task at its end."""
    runs, scorer, _ = FAMILIES[family]
    score = scorer(small)
    with TemporaryDirectory() as tmp:
        pre_dir = Path(tmp) / family
        pre, arms = runs(pre_dir, small, seed, *(_steps(n, every, small) for n in (pretrain, tasks, alone)))
        before, pre_final = train(pre, pre_dir, force=True, progress_bar=False)
        pretraining = {"updates": before.step, "seconds": before.seconds, "valid_loss": pre_final["loss"]}
        data = load_data(next(iter(arms.values())).run, None)  # every arm shares the pretraining's tokenizer
        results: dict[str, Any] = {}
        for i, (name, arm) in enumerate(arms.items()):
            run_dir = Path(tmp) / f"arm-{i}"
            done, final = train(arm.run, run_dir, force=True, progress_bar=False, data=data)
            results[name] = {
                "pretraining_seconds": before.seconds if arm.pretrained else 0.0,
                "curve": curve(run_dir, arm.run, data), "updates": done.step, "seconds": done.seconds,
                "valid_loss": final["loss"],
                **score(run_dir, arm.run),
            }  # fmt: skip
    tuned, alone = (r["curve"] for r in results.values())
    return {
        "family": family,
        "pretraining": pretraining,
        "arms": results,
        "crossing_seconds": crossing(tuned, alone, before.seconds),
        # (update, pretrained arm's loss, the tasks alone's) where both were evaluated
        "equal_updates": [(a[1], a[2], b[2]) for a, b in zip(tuned, alone, strict=False) if a[1] == b[1]],
    }


def plot(result: dict[str, Any], path: Path) -> None:
    """Validation loss against total seconds of training, per arm."""
    from attnkit.chapter.report import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, arm in result["arms"].items():
        offset = arm["pretraining_seconds"]
        ax.plot([(offset + s) / 60 for s, _, _ in arm["curve"]], [loss for _, _, loss in arm["curve"]], label=name)
    pre = result["pretraining"]
    ax.axvline(pre["seconds"] / 60, color="gray", linestyle="dotted", label="end of the pretraining")
    if result["crossing_seconds"] is not None:
        ax.axvline(result["crossing_seconds"] / 60, color="black", linestyle="dashed", label="the curves cross")
    ax.set_xlabel("minutes of training, pretraining included")
    ax.set_ylabel("validation loss on the task")
    family, cpu = result["family"], result["machine"]["cpu_class"]
    ax.set_title(f"{family.upper()}: {FAMILIES[family][2]} ({cpu})", fontsize=9)
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def table(result: dict[str, Any]) -> str:
    """The curves at equal updates on the tasks, and where they cross."""
    pre = result["pretraining"]
    cross = result["crossing_seconds"]
    rows = [f"| {u:,} | {a:.3f} | {b:.3f} |" for u, a, b in result["equal_updates"]]
    where = f"at {cross:.0f} s of total training" if cross is not None else "nowhere in the measured range"
    return "\n".join([
        f"Pretraining: {pre['updates']:,} updates, {pre['seconds']:.0f} s, "
        f"validation loss {pre['valid_loss']:.3f}. The curves cross {where}.",
        "", "| updates on the task | validation loss, pretrained | alone |", "|---|---|---|", *rows,
    ])  # fmt: skip


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks crossing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), default="t5", help="the family (default t5)")
    parser.add_argument("--pretrain", type=int, help="updates of pretraining (default: DEFAULTS, per family)")
    parser.add_argument("--tasks", type=int, help="updates on the task after it (default: DEFAULTS)")
    parser.add_argument("--alone", type=int, help="updates of the task alone (default: DEFAULTS)")
    parser.add_argument("--every", type=int, help="updates between checkpoints scored (default: DEFAULTS)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--small", action="store_true", help="tiny models (a quick check that it runs)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory (default benchmarks/results)")
    args = parser.parse_args(argv)
    flags = ("pretrain", "tasks", "alone", "every")
    for flag, default in zip(flags, DEFAULTS[args.family], strict=True):
        if getattr(args, flag) is None:
            setattr(args, flag, default)
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    if 2 * args.every > min(args.tasks, args.alone):
        parser.error(
            f"--every {args.every} leaves a curve under 2 points in --tasks {args.tasks} / --alone {args.alone}; "
            f"use --every {max(min(args.tasks, args.alone) // 4, 1)}"
        )
    load_before, started = os.getloadavg()[0], time.perf_counter()
    result = {
        **run(args.family, args.pretrain, args.tasks, args.alone, args.every, args.small, args.seed),
        "machine": machine(),
    }
    result |= {"load_before": load_before, "load_after": os.getloadavg()[0],
               "wall_seconds": time.perf_counter() - started}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"crossing-{args.family}" + ("-small" if args.small else "")
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    plot(result, args.out / f"{name}.png")
    print(table(result))
    return 0
