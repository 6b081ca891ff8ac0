"""Few labels [sec:att-families]: a family fine-tuned on 100, 1,000 and all of a task's labelled
examples, from its own pretraining (``python -m benchmarks pretrain``) and from random weights,
over seeds: the chapter's claim that pretraining on plenty of unlabelled text, then a little
labelled data, beats the labelled data alone. BERT and GPT classify verses (by book, by
Testament; GPT through its last token, GPT-1's transfer), GPT also learns a language its
pretraining never read (held-out perplexity), T5 its text-to-text tasks (greedy BLEU)::

    python -m benchmarks fewlabels --family bert|gpt|t5 [--task TASK] [--counts 100,1000,all]
        [--seeds 0,1,2] [--pretrained runs/pretrain/FAMILY] [--small]
    python -m benchmarks fewlabels --figure docs/figures/fewlabels.png   # every committed result, and its table
    python -m benchmarks fewlabels --family gpt --task italian --budget --counts 1000 --seeds 0

Both arms share the pretraining's tokenizer, architecture, schedule and updates per label count
(:data:`STEPS`, :data:`T5_STEPS`; counted, so that the machine's load changes seconds, not results); each arm's
learning rate is its best of :data:`RATES` on validation at each label count, the first seed (said
in the results), and every score is on the test split. Each count is its own experiment, so a run
of some counts adds them to (or replaces them in) the result already in ``--out`` (default
benchmarks/results): ``fewlabels-FAMILY-TASK.json`` and ``.png``.

``--checkpoint best`` scores each run at its lowest validation loss (evaluated every tenth of
its updates) rather than its last update: early stopping, for the few labels the last has
overfitted; its results are their own, ``fewlabels-FAMILY-TASK-best.json``.

``--budget`` answers the budget question instead: at each label count and seed, both arms as
validation-loss curves over the positions they trained on (updates x each batch's token
budget), the pretrained arm's starting where its pretraining's positions end, and the random arm
trained for as many positions as the pretraining and the fine-tuning together, at each arm's
rate from the committed ``fewlabels-FAMILY-TASK.json``; the total at which the pretrained arm's
best so far goes below the other's, if it does (:func:`benchmarks.crossing.crossing`). Results:
``budget-FAMILY-TASK.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from attnkit.chapter.transfer import classifier_scores, task_scores
from attnkit.config import RunConfig, apply_overrides, run_preset
from attnkit.data.prepare import load_data
from attnkit.data.tokenizer import load_tokenizer
from attnkit.models.run_dir import checkpoint_step, complete_checkpoints, latest_checkpoint, read_run_config, run_model
from attnkit.training.evaluate import evaluate
from attnkit.training.run import make_objective, train
from benchmarks.common import machine
from benchmarks.crossing import crossing
from benchmarks.pretrain import PRESETS, curve

RESULTS = Path(__file__).parent / "results"
_CLASSIFICATION = {"books": "which of the 66 books a verse is from", "testament": "which Testament a verse is from"}
# GPT's own kind of task: the causal LM on a language its pretraining never read (Diodati's
# Italian, held out of it: benchmarks.pretrain.HELD_OUT), scored by held-out perplexity.
# T5's: its text-to-text tasks (attnkit.data.corpora.TASKS), one at a time, scored by greedy BLEU.
TASKS = {
    "bert": _CLASSIFICATION,
    "gpt": {**_CLASSIFICATION, "italian": "Italian verses, a language held out"},
    "t5": {"modernize": "King James to World English, text to text", "french": "English to French, text to text"},
}
LM_TASKS = {"italian": "d"}  # task -> the Bible it reads
T5_TASKS = {"modernize": "modernize", "french": "translate English to French"}
SCORED = {False: 300, True: 8}  # held-out verses of a T5 task decoded (greedy); --small: 8
# What each task is scored by, and whether more is better.
METRIC = {"books": ("accuracy", True), "testament": ("accuracy", True), "italian": ("perplexity", False),
          "modernize": ("bleu", True), "french": ("bleu", True)}  # fmt: skip
XLABEL = {"accuracy": "labelled examples", "perplexity": "verses of the held-out language", "bleu": "training pairs"}
ARMS = ("pretrained", "random initialisation")
# Updates per label count (None: all of them), the same for both arms: 100 examples are two
# 2,048-token batches, so 150 updates are 75 passes over them; all (28,000) get about 4.
STEPS: dict[int | None, int] = {100: 150, 1000: 300, None: 600}
# T5's tasks learn to copy, then to change, over thousands of 1,024-token updates (docs/families.md).
T5_STEPS: dict[int | None, int] = {100: 500, 1000: 1000, None: 2500}
BATCH = 2048  # fine-tuning's padded positions an update (T5's tasks: T5_BATCH)
T5_BATCH = 1024
# Each arm's learning rate is chosen from these, on validation: AdamW's (BERT, GPT), and
# Adafactor's relative steps around the rate T5's recipe study found (3e-2).
RATES = {"bert": (1e-4, 3e-4, 1e-3), "gpt": (1e-4, 3e-4, 1e-3), "t5": (1e-2, 3e-2)}
# The architecture both arms take from the pretraining run (the rest is the same preset's).
SHAPE = ("d_model", "n_heads", "d_ff", "n_layers", "max_len")
# What each family's classifier reads: BERT the mean of its tokens (as MiniLM's preset), GPT its
# last token, the one that has seen the whole verse under the causal mask (GPT-1's transfer).
POOLING = {"bert": "mean", "gpt": "last"}
# What a classifier reads of a verse x: what its pretraining read (attnkit.data.tokenizer.read_as_pretrained;
# results measured before that, BERT books' first, read "x").
READS = {"bert": "<s> x </s>", "gpt": "<s> x"}
# Which checkpoint of each fine-tuning run is scored: its last (the results measured before the
# choice existed), or the one of lowest validation loss, evaluated every tenth of its updates
# (early stopping: at few labels the last has overfitted, docs/families.md).
CHECKPOINTS = {"last": "its last update", "best": "its lowest validation loss"}


def arm(family: str, task: str, pre_dir: Path, pretrained: bool, count: int | None, seed: int, lr: float,
        steps: int) -> RunConfig:  # fmt: skip
    """One fine-tuning run: the pretraining run's own model, configuration and tokenizer, with a
    classifier (:data:`POOLING`) or on its family's own objective (:data:`LM_TASKS`,
    :data:`T5_TASKS`), on ``count`` of the task's training examples (None: all), from the
    pretraining's weights or from random ones."""
    pre, _ = read_run_config(pre_dir)
    model = {f"model.{k}": str(getattr(pre.model, k)) for k in SHAPE}
    if task in LM_TASKS:  # the family's own objective on another Bible's verses
        kind = {"data.corpus": "bible", "data.bibles": LM_TASKS[task], "train.eval_batches": "1000000"}
    elif task in T5_TASKS:  # T5's recipe (docs/families.md): no dropout, small batches
        kind = {"train.objective": "translation", "data.corpus": "bible", "data.tasks": T5_TASKS[task],
                "model.dropout": "0.0", "train.batch_tokens": str(T5_BATCH)}  # fmt: skip
    else:
        kind = {"model.lm_head": "false", "model.classifier_pooling": POOLING[family], "train.objective": "classify",
                "data.corpus": task, "data.source": "4"}  # fmt: skip
    changes = {
        **model, "model.dropout": "0.1", "data.tokenizer": str(pre_dir / "tokenizer.json"),
        "data.train_examples": "null" if count is None else str(count), "data.max_tokens": "96",
        "train.seed": str(seed), "train.lr": str(lr), "train.max_steps": str(steps), "train.time_budget": "null",
        "train.schedule": "cosine", "train.warmup": str(max(steps // 10, 1)), "train.batch_tokens": str(BATCH),
        "train.checkpoint_every": str(steps), "train.eval_every": "0", "train.log_every": str(max(steps // 10, 1)),
        "train.weight_decay": "0.01", "train.precision": "auto", "train.init": str(pre_dir) if pretrained else "null",
        **kind,
    }  # fmt: skip
    return apply_overrides(run_preset(PRESETS[family]), changes)


def lm_scores(run_dir: Path, run: RunConfig, split: str) -> dict[str, Any]:
    """Loss and perplexity over every example of a held-out ``split``."""
    data = load_data(run, load_tokenizer(run_dir / "tokenizer.json"))
    scores = evaluate(run_model(run_dir), make_objective(run, data.specials), getattr(data, split), run)
    return {"perplexity": scores["perplexity"], "loss": scores["loss"], "tokens": scores["tokens"]}


def scores(run_dir: Path, run: RunConfig, split: str, scored: int) -> dict[str, Any]:
    """A trained run's scores on ``split``: accuracy (a classifier), greedy BLEU on the first
    ``scored`` verses (text to text) or perplexity (a language model)."""
    if run.objective == "classify":
        got = classifier_scores(run_dir, run, split)
        return {"accuracy": got["accuracy"], "macro_f1": got["macro_f1"], "examples": got["verses"]}
    if run.objective == "translation":
        return next(iter(task_scores(run_dir, run, scored, split).values()))
    return lm_scores(run_dir, run, split)


def fine_tune(
    run: RunConfig, splits: tuple[str, ...], scored: int, checkpoint: str = "last"
) -> dict[str, dict[str, Any]]:
    """Train ``run`` in a directory of its own; split -> the scores of its ``checkpoint``
    (:data:`CHECKPOINTS`) on each of ``splits``."""
    every = max(run.train.max_steps // 10, 1)
    if checkpoint == "best":  # a checkpoint at each evaluation of the whole validation split, all kept
        run = apply_overrides(run, {
            "train.eval_every": str(every), "train.checkpoint_every": str(every), "train.eval_batches": "1000000",
            "train.keep_checkpoints": str(run.train.max_steps // every + 1)})  # fmt: skip
    with TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        done, final = train(run, run_dir, progress_bar=False)
        trained = {"updates": done.step, "seconds": done.seconds, "valid_loss": final["loss"]}
        if checkpoint == "best":
            trained["scored_update"], trained["scored_valid_loss"] = keep_best(run_dir)
        return {split: {**scores(run_dir, run, split, scored), **trained} for split in splits}


def keep_best(run_dir: Path) -> tuple[int, float]:
    """The update of ``run_dir``'s lowest validation loss (the earliest of equals; updates with
    no checkpoint, such as 0, left out) and that loss; the checkpoints after it are removed, so
    that the run's model is the one at that update."""
    checkpoints = {checkpoint_step(c): c for c in complete_checkpoints(run_dir)}
    losses: dict[int, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)  # periodic evaluations, and the final one (at the last checkpoint)
        if record["split"] == "valid" and record["step"] in checkpoints:
            losses.setdefault(record["step"], record["loss"])
    best = min(losses, key=lambda step: (losses[step], step))
    for step, path in checkpoints.items():
        if step > best:
            shutil.rmtree(path)
    return best, losses[best]


def at_count(family: str, task: str, pre_dir: Path, count: int | None, seeds: list[int], steps: int,
             scored: int = SCORED[False], checkpoint: str = "last") -> dict[str, Any]:  # fmt: skip
    """One label count: each arm's rate, its best of :data:`RATES` on validation at ``seeds[0]``
    (the chosen run's test scores are that seed's result), then the other seeds at that rate,
    scored on test; each run's ``checkpoint`` scored (:data:`CHECKPOINTS`)."""
    metric, higher = METRIC[task]
    best = max if higher else min
    out: dict[str, Any] = {"steps": steps, "rates": {}, "tuning": {}, "arms": {}}
    for name in ARMS:
        this = partial(arm, family, task, pre_dir, name == ARMS[0], count)  # (seed, lr, steps) -> its RunConfig
        grid = {str(lr): fine_tune(this(seeds[0], lr, steps), ("valid", "test"), scored, checkpoint)
                for lr in RATES[family]}  # fmt: skip
        chosen = best(grid, key=lambda lr: grid[lr]["valid"][metric])
        out["tuning"][name] = {lr: runs["valid"] for lr, runs in grid.items()}
        out["rates"][name] = rate = float(chosen)
        others = [fine_tune(this(seed, rate, steps), ("test",), scored, checkpoint)["test"] for seed in seeds[1:]]
        out["arms"][name] = [grid[chosen]["test"], *others]
    return out


def label(count: int | None) -> str:
    """A label count as results name it: ``"100"``, ``"all"``."""
    return str(count or "all")


def run(family: str, task: str, pre_dir: Path, counts: list[int | None], seeds: list[int],
        steps: dict[int | None, int], scored: int = SCORED[False],
        checkpoint: str = "last") -> dict[str, Any]:  # fmt: skip
    """Every label count (:func:`at_count`), as one result: per count its updates, each arm's
    rate, the count its rate was chosen at (its own), the tuning grid, and each arm's test
    scores over the seeds."""
    result: dict[str, Any] = {**header(family, task, pre_dir, seeds, checkpoint), "steps": {}, "rates": {},
                              "tuned_at": {}, "tuning": {}, "arms": {name: {} for name in ARMS}}  # fmt: skip
    for count in counts:
        one = at_count(family, task, pre_dir, count, seeds, steps[count], scored, checkpoint)
        key = label(count)
        for field in ("steps", "rates", "tuning"):
            result[field][key] = one[field]
        result["tuned_at"][key] = key
        for name in ARMS:
            result["arms"][name][key] = one["arms"][name]
    return result


def header(family: str, task: str, pre_dir: Path, seeds: list[int], checkpoint: str = "last") -> dict[str, Any]:
    """What must agree for two results to be one table: the same experiment on the same class
    of CPU (:func:`same`)."""
    pre, _ = read_run_config(pre_dir)
    return {"family": family, "task": task, "pretraining": str(pre_dir), "pretraining_steps": pre.train.max_steps,
            "seeds": seeds, "reads": READS[family] if task in _CLASSIFICATION else None, "checkpoint": checkpoint,
            "machine": machine()}  # fmt: skip


SAME = ("family", "task", "pretraining", "pretraining_steps", "seeds", "reads", "checkpoint")


def same(old: dict[str, Any], new: dict[str, Any], path: Path) -> None:
    """Refuse, naming the field and the fix, where ``old`` (from ``path``) and ``new`` are not
    the same experiment on the same CPU class (:func:`header`)."""
    for field in SAME:
        if old.get(field) != new[field]:
            raise ValueError(f"{path} holds {field} {old.get(field)!r}, this run {new[field]!r}: not one table; "
                             f"give --out another directory or move {path.name} away")  # fmt: skip
    if old["machine"]["cpu_class"] != new["machine"]["cpu_class"]:
        raise ValueError(f"{path} was measured on {old['machine']['cpu_class']}, this machine is "
                         f"{new['machine']['cpu_class']}; give --out another directory")  # fmt: skip


def merge(old: dict[str, Any], new: dict[str, Any], path: Path) -> dict[str, Any]:
    """``new``'s label counts added to (or replacing) ``old``'s: each count is tuned and measured
    on its own, so a count can be run alone (:func:`same` first)."""
    same(old, new, path)
    order = ["all" if c is None else str(c) for c in sorted(_counts(",".join(set(old["steps"]) | set(new["steps"]))),
                                                            key=lambda c: math.inf if c is None else c)]  # fmt: skip
    merged = {**old, **{field: new[field] for field in SAME}}
    for field in ("steps", "rates", "tuned_at", "tuning", "measured"):
        both = old.get(field, {}) | new[field]
        merged[field] = {c: both[c] for c in order if c in both}
    merged["arms"] = {name: {c: (old["arms"][name] | new["arms"][name])[c] for c in order} for name in ARMS}
    return merged


def best_so_far(points: list[tuple[int, int, float]]) -> list[tuple[int, int, float]]:
    """Each point's loss replaced by the lowest up to it: what the arm would give, stopped at
    its best validation, by that many positions (a long arm's overfitting does not count)."""
    lowest = float("inf")
    return [(p, u, lowest := min(lowest, loss)) for p, u, loss in points]


def budget(family: str, task: str, pre_dir: Path, count: int | None, seed: int, rates: dict[str, float],
           steps: int) -> dict[str, Any]:  # fmt: skip
    """The budget question at one label count and seed: each arm's validation loss (the whole
    split) over the positions trained on (updates x the batch's token budget: padded positions,
    an upper bound), the pretrained arm's after its pretraining's, the random arm's for as many
    as both of the pretrained arm's runs together, at the rate tuned for ``steps`` updates; and
    the total at which the pretrained arm's best so far goes below the random arm's
    (:func:`best_so_far`, :func:`benchmarks.crossing.crossing`). The pretrained arm is scored
    a tenth of its updates apart, the random arm a fortieth."""
    pre, _ = read_run_config(pre_dir)
    done_steps = checkpoint_step(latest_checkpoint(pre_dir))  # what train.init loads, however the run ended
    spent = done_steps * pre.train.batch_tokens * pre.train.batches_per_step
    per_update = T5_BATCH if task in T5_TASKS else BATCH  # arm()'s batch_tokens
    curves: dict[str, list[tuple[int, int, float]]] = {}
    with TemporaryDirectory() as tmp:
        for name, (updates, points) in zip(ARMS, ((steps, 10), (steps + math.ceil(spent / per_update), 40)),
                                           strict=True):  # fmt: skip
            every = str(max(updates // points, 1))
            run = apply_overrides(arm(family, task, pre_dir, name == ARMS[0], count, seed, rates[name], updates), {
                "train.eval_every": every, "train.log_every": every, "train.eval_batches": "1000000"})  # fmt: skip
            done, final = train(run, Path(tmp) / name, progress_bar=False)
            points_at = {u: loss for u, _, loss in curve(Path(tmp) / name)["valid"]} | {done.step: final["loss"]}
            curves[name] = [(u * per_update, u, loss) for u, loss in sorted(points_at.items())]
    best = {name: best_so_far(c) for name, c in curves.items()}
    return {"count": count, "seed": seed, "pretraining_updates": done_steps, "pretraining_positions": spent,
            "curves": curves, "best": {name: c[-1][2] for name, c in best.items()},
            "crossing_positions": crossing(best[ARMS[0]], best[ARMS[1]], offset=spent)}  # fmt: skip


def panels(items: list[Any], draw_one: Callable[[Any, Any], None], path: Path, height: float = 3.8,
           per_row: int = 3) -> None:  # fmt: skip
    """One panel per item, ``per_row`` to a row, each drawn by ``draw_one(ax, item)``, saved to
    ``path``."""
    from attnkit.chapter.report import pyplot

    plt = pyplot()
    columns = min(per_row, len(items))
    rows = -(-len(items) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, height * rows), squeeze=False)
    flat = list(axes.flat)
    for ax, item in zip(flat, items, strict=False):
        draw_one(ax, item)
    for ax in flat[len(items) :]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def draw_budget(result: dict[str, Any], ax: Any, one: dict[str, Any]) -> None:
    """One (count, seed)'s validation loss over total positions, the pretrained arm after its
    pretraining, and each arm's best so far (dashed); a dotted line where the pretrained arm's
    goes below."""
    for name, points in one["curves"].items():
        offset = one["pretraining_positions"] if name == ARMS[0] else 0
        xs = [(offset + p) / 1e6 for p, _, _ in points]
        (line,) = ax.plot(xs, [loss for _, _, loss in points], marker=".", label=name)
        ax.plot(xs, [loss for _, _, loss in best_so_far(points)], linestyle="--", color=line.get_color(),
                label=f"{name}, best so far")  # fmt: skip
    if one["crossing_positions"] is not None:
        ax.axvline(one["crossing_positions"] / 1e6, linestyle=":", color="grey")
    ax.set_xlabel("updates x batch tokens, pretraining included (millions)")
    ax.set_ylabel("validation loss")
    ax.set_title(f"{result['family'].upper()} {result['task']}, {one['count'] or 'all'} examples, seed "
                 f"{one['seed']}\n({result['machine']['cpu_class']})", fontsize=8)  # fmt: skip
    ax.legend(fontsize=7)


def summary(result: dict[str, Any], metric: str | None = None) -> dict[str, dict[str, tuple[float, float]]]:
    """arm -> label count -> (``metric``'s mean over the seeds, their standard deviation);
    by default the task's own metric (:data:`METRIC`)."""
    metric = metric or METRIC[result["task"]][0]
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for name, by_count in result["arms"].items():
        out[name] = {}
        for count, runs in by_count.items():
            values = [r[metric] for r in runs]
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            out[name][count] = (statistics.fmean(values), spread)
    return out


def table(result: dict[str, Any]) -> str:
    """Each arm's mean ± spread per label count, and the pretrained arm's gain: accuracy points
    (and macro-F1's, which a majority class cannot reach by itself), or the ratio of
    perplexities."""
    means = summary(result)
    metric, _ = METRIC[result["task"]]
    accuracy = metric == "accuracy"
    f1 = summary(result, "macro_f1") if accuracy else {}
    rows = []
    for count in means[ARMS[0]]:
        (a, sa), (b, sb) = means[ARMS[0]][count], means[ARMS[1]][count]
        if accuracy:
            (fa, sfa), (fb, sfb) = f1[ARMS[0]][count], f1[ARMS[1]][count]
            rows.append(f"| {count} | {a:.1%} ± {sa:.1%} | {b:.1%} ± {sb:.1%} | {100 * (a - b):+.1f} | "
                        f"{fa:.3f} ± {sfa:.3f} / {fb:.3f} ± {sfb:.3f} |")  # fmt: skip
        else:
            ratio = f"{a / b:.2f}×" if b > 0 else "—"
            rows.append(f"| {count} | {a:.1f} ± {sa:.1f} | {b:.1f} ± {sb:.1f} | {ratio} |")
    rates = "; ".join(f"{c} {' / '.join(f'{lr:g}' for lr in by_arm.values())}"
                      + ("" if result["tuned_at"][c] == c else f" (chosen at {result['tuned_at'][c]})")
                      for c, by_arm in result["rates"].items())  # fmt: skip
    examples = "labels" if accuracy else "pairs" if metric == "bleu" else "verses"
    return "\n".join([
        f"{result['family'].upper()}, {TASKS[result['family']][result['task']]}"
        + (f", the classifier reading {result['reads']}" if result.get("reads") else "")
        + f" (test {metric} of each run's checkpoint at {CHECKPOINTS[result['checkpoint']]}, over seeds "
        f"{result['seeds']}; each arm's rate, pretrained / random, chosen on validation at each count: {rates})", "",
        f"| {examples} | pretrained | random initialisation | "
        + ("points | macro-F1, pretrained / random |" if accuracy else "ratio |"),
        "|---|---|---|---|" + ("---|" if accuracy else ""), *rows,
    ])  # fmt: skip


def draw(ax: Any, result: dict[str, Any]) -> None:
    """The task's test metric against the examples trained on, per arm (mean ± one standard
    deviation of the seeds), on ``ax``."""
    for name, by_count in summary(result).items():
        counts = list(by_count)
        xs = range(len(counts))
        ys, spreads = [by_count[c][0] for c in counts], [by_count[c][1] for c in counts]
        ax.errorbar(xs, ys, yerr=spreads, marker="o", capsize=3, label=name)
        ax.set_xticks(list(xs), counts)
    metric = METRIC[result["task"]][0]
    ax.set_xlabel(XLABEL[metric])
    ax.set_ylabel(f"test {'BLEU (greedy)' if metric == 'bleu' else metric}")
    if metric == "perplexity":
        ax.set_yscale("log")
    what = TASKS[result["family"]][result["task"]]
    at = ", best validation checkpoint" if result["checkpoint"] == "best" else ""
    ax.set_title(f"{result['family'].upper()}: {what}\n({result['machine']['cpu_class']}, "
                 f"{len(result['seeds'])} seeds{at})", fontsize=8)  # fmt: skip
    ax.legend(fontsize=7)


def figure(results_dir: Path, path: Path) -> list[Path]:
    """The learning curves of every committed result in ``results_dir`` (not the --small
    ones), drawn into ``path``; the files drawn."""
    files = sorted(f for f in results_dir.glob("fewlabels-*.json") if not f.stem.endswith("-small"))
    if not files:
        raise ValueError(f"no fewlabels-*.json in {results_dir}; run python -m benchmarks fewlabels first")
    panels([json.loads(f.read_text(encoding="utf-8")) for f in files], draw, path)
    return files


def _counts(text: str) -> list[int | None]:
    return [None if item == "all" else int(item) for item in text.split(",")]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks fewlabels", description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=sorted(TASKS), default="bert")
    parser.add_argument("--task", default="books", help="bert: books, testament; gpt: also italian; t5: modernize, "
                        "french (default books)")  # fmt: skip
    parser.add_argument("--counts", type=_counts, default=[100, 1000, None], help="label counts (default 100,1000,all)")
    parser.add_argument("--seeds", type=lambda t: [int(s) for s in t.split(",")], default=[0, 1, 2])
    parser.add_argument("--pretrained", type=Path, help="the pretraining run (default runs/pretrain/FAMILY)")
    parser.add_argument("--small", action="store_true", help="a few updates each (a quick check that it runs)")
    parser.add_argument("--budget", action="store_true", help="both arms as curves over the positions trained "
                        "on, pretraining's included, to where the pretrained one overtakes (e.g. --counts 1000 "
                        "--seeds 0)")  # fmt: skip
    parser.add_argument("--checkpoint", choices=sorted(CHECKPOINTS), default="last",
                        help="score each run's last checkpoint (default) or its best on validation loss, "
                        "evaluated every tenth of its updates (a result of its own: "
                        "fewlabels-FAMILY-TASK-best.json)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory (default benchmarks/results)")
    parser.add_argument("--figure", type=Path, metavar="PNG",
                        help="draw every result in --out into PNG (docs/figures/fewlabels.png) and stop")  # fmt: skip
    args = parser.parse_args(argv)
    if args.figure is not None:
        drawn = figure(args.out, args.figure)
        for f in drawn:  # each result's table, as docs/families.md shows it
            print(table(json.loads(f.read_text(encoding="utf-8"))), end="\n\n")
        print(f"{args.figure}: {', '.join(f.stem for f in drawn)}")
        return 0
    if args.task not in TASKS[args.family]:
        parser.error(f"--task {args.task!r}: {args.family} has {', '.join(TASKS[args.family])}")
    if any(c is not None and c < 1 for c in args.counts):
        parser.error(f"--counts must be >= 1 or 'all', got {args.counts}")
    pre_dir = args.pretrained or Path("runs") / "pretrain" / args.family
    if not (pre_dir / "run.json").is_file():
        parser.error(f"{pre_dir} is no pretraining run; make one: python -m benchmarks pretrain --family {args.family}")
    counted = T5_STEPS if args.family == "t5" else STEPS
    steps = {c: 4 if args.small else counted.get(c, counted[1000]) for c in args.counts}  # other counts: 1,000's
    small = ("-best" if args.checkpoint == "best" else "") + ("-small" if args.small else "")
    tuned = args.out / f"fewlabels-{args.family}-{args.task}{small}.json"
    if args.budget:
        rates = json.loads(tuned.read_text(encoding="utf-8"))["rates"] if tuned.is_file() else {}
        if missing := [label(c) for c in args.counts if label(c) not in rates]:
            parser.error(f"--budget takes each arm's rate from {tuned}, which has none at {', '.join(missing)}; run "
                         f"python -m benchmarks fewlabels --family {args.family} --task {args.task} --counts "
                         f"{','.join(missing)}{' --small' if args.small else ''} first")  # fmt: skip
    path = args.out / f"{'budget' if args.budget else 'fewlabels'}-{args.family}-{args.task}{small}.json"
    if not args.budget and path.is_file():  # refused now, not after hours of training
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
            same(old, header(args.family, args.task, pre_dir, args.seeds, args.checkpoint), path)
        except ValueError as e:
            parser.error(str(e))
    load_before, started = os.getloadavg()[0], time.perf_counter()
    if args.budget:
        result = {"family": args.family, "task": args.task, "pretraining": str(pre_dir),
                  "rates": {label(c): rates[label(c)] for c in args.counts},
                  "runs": [budget(args.family, args.task, pre_dir, c, seed, rates[label(c)], steps[c])
                           for c in args.counts for seed in args.seeds]}  # fmt: skip
    else:
        result = run(args.family, args.task, pre_dir, args.counts, args.seeds, steps, SCORED[args.small],
                     args.checkpoint)  # fmt: skip
    measured = {"load_before": load_before, "load_after": os.getloadavg()[0],
                "wall_seconds": time.perf_counter() - started}  # fmt: skip
    if args.budget:
        result |= {"machine": machine(), **measured}
    else:  # each count is its own experiment: added to the ones already measured
        measured |= {"date": result["machine"]["date"], "counts": [label(c) for c in args.counts]}
        result["measured"] = {label(c): measured for c in args.counts}
        if path.is_file():
            result = merge(json.loads(path.read_text(encoding="utf-8")), result, path)
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if args.budget:
        panels(result["runs"], partial(draw_budget, result), path.with_suffix(".png"), height=3.6)
        for one in result["runs"]:
            where = one["crossing_positions"]
            print(f"{one['count'] or 'all'} examples, seed {one['seed']}: best validation loss "
                  + ", ".join(f"{arm} {loss:.3f}" for arm, loss in one["best"].items())
                  + ("; the pretrained arm never goes below" if where is None
                     else f"; the pretrained arm below from {where / 1e6:.1f} M positions"))  # fmt: skip
        return 0
    panels([result], draw, path.with_suffix(".png"))
    print(table(result))
    return 0
