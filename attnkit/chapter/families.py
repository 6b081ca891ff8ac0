"""The three families of [tab:att-families], trained: BERT (encoder only, masked language
modelling), GPT (decoder only, next-token prediction) and T5 (encoder–decoder, span
corruption), each a tiny model of its family trained for the same number of steps on the
same English text with its own objective and its family's usual optimisation.

:func:`train_steps` is also how :mod:`attnkit.chapter.prenorm` trains its runs.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import torch

from attnkit.chapter.report import Context, Section, pyplot, save, table
from attnkit.config import RUN_PRESETS, RunConfig, apply_overrides, preset, run_preset
from attnkit.data.corpora import BIBLES
from attnkit.data.prepare import Data, load_data
from attnkit.models import build_model
from attnkit.training.run import model_config_for, train
from attnkit.training.trainer import METRICS, NonFiniteLossError

# The chapter's labels this experiment shows (docs/chapter.md's figure column reads them).
LABELS = ("tab:att-families", "sec:att-families")
FAMILIES = {  # name -> (run preset, architecture, objective as the chapter's table words it, typical use)
    "BERT": ("bert-bible", "Encoder only", "Masked language modelling", "Understanding"),
    "GPT": ("gpt-bible", "Decoder only", "Next-token prediction", "Generation"),
    "T5": ("t5-bible", "Encoder–decoder", "Span corruption", "Text-to-text"),
}
# The same budget for every family: steps, tokens per batch, held-out batches; the vocabulary
# size and which Bibles: quick mode reads only the World English Bible.
BUDGET = {
    True: {"train.max_steps": 120, "train.batch_tokens": 1024, "train.eval_batches": 5, "data.vocab_size": 1000},
    False: {"train.max_steps": 800, "train.batch_tokens": 2048, "train.eval_batches": 20, "data.vocab_size": 8000},
}
TEXTS = {True: "4", False: "k,4"}  # which Bibles (attnkit.data.corpora.BIBLES)
LAST = 10  # the final loss is the mean training loss of the last LAST steps
# What the held-out rate of correct argmax predictions measures under each objective.
ACCURACY = {
    "masked_lm": "MLM accuracy",
    "causal_lm": "next-token accuracy",
    "span_corruption": "span-token accuracy, sentinels included",
}


@dataclass
class Trained:
    """One run of :func:`train_steps`."""

    run: RunConfig  # as trained: the vocabulary's size and special ids filled in
    parameters: int
    losses: list[float]  # the training loss of every step, up to the last finite one
    diverged: bool  # the loss became NaN or infinite, and the trainer stopped there
    final: dict[str, float]  # the held-out evaluation at the end; empty when diverged


def train_steps(run: RunConfig, data: Data, run_dir: Path) -> Trained:
    """Train ``run`` for ``train.max_steps`` steps (:func:`attnkit.training.run.train`) on
    ``data``, read and tokenized once for several runs, logging every step's loss into
    ``run_dir``. A loss that becomes non-finite ends the run as diverged."""
    changes = dict(log_every=1, eval_every=0, checkpoint_every=run.train.max_steps, time_budget=None)
    run = dataclasses.replace(run, train=dataclasses.replace(run.train, **changes))
    try:
        _, final = train(run, run_dir, force=True, progress_bar=False, data=data)
        diverged = False
    except NonFiniteLossError:
        final, diverged = {}, True
    records = [json.loads(line) for line in (run_dir / METRICS).read_text(encoding="utf-8").splitlines()]
    losses = [r["loss"] for r in records if r["split"] == "train"]
    run = model_config_for(run, data)
    with torch.device("meta"):
        parameters = build_model(run.model).num_parameters()
    return Trained(run, parameters, losses, diverged, final)


def family_run(name: str, quick: bool, seed: int) -> RunConfig:
    """The family's Bible run preset with its tiny model (``<family>-tiny``), dropout off, and
    the shared budget; warm-up over the first tenth of the steps."""
    run_name = FAMILIES[name][0]
    base = run_preset(run_name)
    run = RunConfig(preset(RUN_PRESETS[run_name][0], dropout=0.0), base.train, base.data)
    budget = BUDGET[quick]
    changes = {
        **budget, "train.warmup": max(1, int(budget["train.max_steps"]) // 10), "train.seed": seed,
        "data.bibles": TEXTS[quick],
    }  # fmt: skip
    return apply_overrides(run, {k: str(v) for k, v in changes.items()})


def _plot(results: dict[str, Trained], ctx: Context) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, result in results.items():
        ax.plot(range(1, len(result.losses) + 1), result.losses, label=f"{name} ({result.run.objective})")
    ax.set_xlabel("step")
    ax.set_yscale("log")
    ax.set_ylabel("training loss (nats per target token, log scale)")
    ax.set_title("the three families on the same text, each with its own objective")
    ax.legend()
    return save(fig, ctx, "families-loss.png")


def _row(name: str, f: dict[str, Any]) -> list[str]:
    accuracy = ACCURACY[f["objective"]]
    return [
        name, *FAMILIES[name][1:], f["model"], f"{f['parameters']:,}", str(f["steps"]), f"{f['first_loss']:.2f}",
        f"{f['final_loss']:.2f}", f"{f['held_out_loss']:.2f}", f"{f['perplexity']:.1f}",
        f"{f[accuracy]:.1%} ({accuracy})",
    ]  # fmt: skip


def run(ctx: Context) -> Section:
    runs = {name: family_run(name, ctx.quick, ctx.seed) for name in FAMILIES}
    data = load_data(next(iter(runs.values())), None)  # the same text and tokenizer for all three
    with TemporaryDirectory() as tmp:
        results = {name: train_steps(r, data, Path(tmp) / name) for name, r in runs.items()}
    families: dict[str, dict[str, Any]] = {}
    for name, result in results.items():
        if result.diverged:
            raise RuntimeError(f"{name}'s loss became non-finite at step {len(result.losses) + 1}; lower its train.lr")
        objective = result.run.objective
        families[name] = {
            "architecture": FAMILIES[name][1],
            "objective": objective,
            "model": RUN_PRESETS[FAMILIES[name][0]][0],
            "parameters": result.parameters,
            "steps": len(result.losses),
            "first_loss": result.losses[0],
            "final_loss": sum(result.losses[-LAST:]) / len(result.losses[-LAST:]),
            "held_out_loss": result.final["loss"],
            "perplexity": result.final["perplexity"],
            ACCURACY[objective]: result.final["correct_rate"],
        }
    first = next(iter(results.values())).run
    header = [
        "Family", "Architecture", "Pre-training objective", "Typical use", "model", "parameters", "steps",
        "first loss", "final loss", "held-out loss", "held-out perplexity", "held-out accuracy",
    ]  # fmt: skip
    rows = [_row(name, f) for name, f in families.items()]
    fell = [n for n, f in families.items() if f["final_loss"] < f["first_loss"]]
    verdict = "Every family's loss fell" if len(fell) == len(families) else f"The loss fell only for {', '.join(fell)}"
    sizes = ", ".join(
        f"{families[name]['model']}: d_model {r.run.model.d_model}, {r.run.model.n_layers} layers"
        for name, r in results.items()
    )
    texts = " and the ".join(BIBLES[code] for code in first.data.bibles)
    rates = ", ".join(f"{name} {r.run.train.optimizer} at {r.run.train.lr:g}" for name, r in results.items())
    text = f"""
The chapter's table [tab:att-families] with each family trained: a tiny model of each ({sizes}; dropout off),
trained for {first.train.max_steps} steps of about {first.train.batch_tokens} tokens on the same Bible verses (the
{texts}; one byte-level BPE of {data.tokenizer.get_vocab_size()} tokens), each with its own objective and its
family's usual optimiser and peak learning rate ({rates}; Adafactor's relative to each weight's scale), warm-up over
{first.train.warmup} steps, then cosine decay. First loss: the training loss of step 1; final loss: the mean training
loss of the last {LAST} steps; held-out: {first.train.eval_batches} batches of verses from held-out chapters, after
training.

{table(header, rows)}

The losses are not comparable across families: each is the cross entropy of a different prediction — BERT's of the
tokens it hid, seeing both sides of them; GPT's of every next token, seeing only the past; T5's of the hidden spans,
which its decoder regenerates behind sentinel tokens. {verdict}:
{", ".join(f"{n} from {f['first_loss']:.2f} to {f['final_loss']:.2f}" for n, f in families.items())}.
"""
    return Section(
        "The three families, trained", LABELS, text, [_plot(results, ctx)],
        {"families": families, "curves": {n: r.losses for n, r in results.items()}},
    )  # fmt: skip
