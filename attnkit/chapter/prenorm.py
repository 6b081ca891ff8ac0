"""Pre-LN versus post-LN (the chapter's remark after [eq:att-addnorm]: normalising before the
sub-layer "keeps the residual path entirely free of normalization and trains more stably at
large depth").

The same causal language model on English Bible text, at 6, 12 and 24 layers, with each
sub-layer wrapped post-LN, x -> LayerNorm(x + Sublayer(x)) [eq:att-addnorm], or pre-LN,
x -> x + Sublayer(LayerNorm(x)), trained for the same steps with Adam at a constant learning
rate, from the first step or after a linear warm-up: twelve runs.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import numpy as np

from attnkit.chapter.families import Trained, train_steps
from attnkit.chapter.report import Context, Section, pyplot, save, table
from attnkit.config import RUN_PRESETS, RunConfig, apply_overrides, preset, run_preset
from attnkit.data.corpora import BIBLES
from attnkit.data.prepare import Data, load_data

# The chapter's labels this experiment shows (docs/chapter.md's figure column reads them).
LABELS = ("eq:att-addnorm", "eq:att-layernorm", "eq:att-ffn")

DEPTHS = (6, 12, 24)
NORMS = {"post": False, "pre": True}  # -> model.norm_first
SCHEDULES = ("nowarmup", "warmup")
# Per mode: width, steps, tokens per batch, held-out batches. Warm-up (when on): the first quarter.
SIZES = {
    True: {"model.d_model": 64, "train.max_steps": 30, "train.batch_tokens": 256, "train.eval_batches": 2},
    False: {"model.d_model": 64, "train.max_steps": 400, "train.batch_tokens": 512, "train.eval_batches": 10},
}
# Adam at a constant rate, nothing else: no weight decay, no clipping, no dropout. The
# "cosine" schedule with min_lr_ratio 1 is a linear warm-up to the rate, then flat.
OPTIMISATION = {
    "train.optimizer": "adam", "train.lr": 1e-3, "train.weight_decay": 0.0, "train.clip_norm": "none",
    "train.schedule": "cosine", "train.min_lr_ratio": 1.0, "model.dropout": 0.0,
    "data.bibles": "4", "data.vocab_size": 1000,
}  # fmt: skip
STALL = 0.1  # nats: a final held-out loss within this of the unigram baseline (or above) = stalled
SMOOTH = 10  # steps of the running mean drawn in the figure


def base_run(quick: bool, seed: int) -> RunConfig:
    """gpt-bible's data with gpt-tiny's model, resized, and :data:`OPTIMISATION`."""
    gpt = run_preset("gpt-bible")
    run = RunConfig(preset(RUN_PRESETS["gpt-bible"][0]), gpt.train, gpt.data)
    sizes = SIZES[quick]
    changes = {**OPTIMISATION, **sizes, "model.d_ff": 4 * sizes["model.d_model"], "train.seed": seed}
    return apply_overrides(run, {k: str(v) for k, v in changes.items()})


def unigram_loss(data: Data) -> float:
    """The cross entropy (nats per token) of the held-out labels under the training tokens'
    frequencies (add-one smoothed): the loss of a model that learnt nothing but how common each
    token is. The labels are the causal objective's: every token of a verse, then ``eos``."""
    counts = Counter(t for example in data.train for t in example)
    counts[data.specials.eos] += len(data.train)
    total, vocab = sum(counts.values()), data.tokenizer.get_vocab_size()
    held_out = [t for example in data.valid for t in [*example, data.specials.eos]]
    return -sum(math.log((counts[t] + 1) / (total + vocab)) for t in held_out) / len(held_out)


def status(result: Trained, unigram: float) -> str:
    if result.diverged:
        return "diverged"
    return "stalled" if result.final["loss"] >= unigram - STALL else "trained"


def _plot(results: dict[str, Trained], unigram: float, ctx: Context) -> str:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(DEPTHS), figsize=(5 * len(DEPTHS), 4), sharey=True)
    styles = {"post": "tab:red", "pre": "tab:blue"}
    for ax, depth in zip(axes, DEPTHS, strict=True):
        for norm in NORMS:
            for schedule in SCHEDULES:
                losses = results[f"{norm}-{schedule}-{depth}"].losses
                window = min(SMOOTH, len(losses))
                mean = np.convolve(losses, np.ones(window) / window, mode="valid")
                ax.plot(
                    range(window, len(losses) + 1), mean, color=styles[norm], ls="-" if schedule == "warmup" else "--",
                    label=f"{norm}-LN, {'warm-up' if schedule == 'warmup' else 'no warm-up'}",
                )  # fmt: skip
        ax.axhline(unigram, color="grey", lw=0.8, ls=":", label="unigram baseline (held-out)")
        ax.set_title(f"{depth} layers")
        ax.set_xlabel("step")
    axes[0].set_ylabel(f"training loss, running mean of {SMOOTH} steps (nats)")
    axes[0].legend(fontsize=8)
    return save(fig, ctx, "prenorm-loss.png")


def run(ctx: Context) -> Section:
    base = base_run(ctx.quick, ctx.seed)
    data = load_data(base, None)
    unigram = unigram_loss(data)
    warmup = base.train.max_steps // 4
    results: dict[str, Trained] = {}
    with TemporaryDirectory() as tmp:
        for depth in DEPTHS:
            for norm, first in NORMS.items():
                for schedule in SCHEDULES:
                    key = f"{norm}-{schedule}-{depth}"
                    changes = {"model.n_layers": depth, "model.norm_first": first}
                    changes["train.warmup"] = warmup if schedule == "warmup" else 0
                    run = apply_overrides(base, {k: str(v) for k, v in changes.items()})
                    results[key] = train_steps(run, data, Path(tmp) / key)
    final = {k: (None if r.diverged else r.final["loss"]) for k, r in results.items()}
    statuses = {k: status(r, unigram) for k, r in results.items()}
    columns = [(norm, schedule) for norm in NORMS for schedule in SCHEDULES]
    header = ["layers", *(f"{n}-LN, {'warm-up' if s == 'warmup' else 'no warm-up'}" for n, s in columns)]
    rows = [
        [str(depth), *(_cell(final[f"{n}-{s}-{depth}"], statuses[f"{n}-{s}-{depth}"]) for n, s in columns)]
        for depth in DEPTHS
    ]
    model = base.model
    text = f"""
A GPT-style causal language model (d_model {model.d_model}, {model.n_heads} heads, d_ff {model.d_ff}, learned
positions, no dropout) at {", ".join(map(str, DEPTHS))} layers, each post-LN (norm_first=False, [eq:att-addnorm]) and
pre-LN (norm_first=True, plus the final LayerNorm a pre-LN stack needs), trained for {base.train.max_steps} steps of
about {base.train.batch_tokens} tokens of the {BIBLES[base.data.bibles[0]]} (byte-level BPE of
{data.tokenizer.get_vocab_size()} tokens) with Adam at a constant learning rate of {base.train.lr:g}: from the first
step (no warm-up), or after a linear warm-up over the first {warmup} steps. No gradient clipping, weight decay or
dropout, the same seed and batches for every run: only the arrangement, the depth and the schedule differ.

Final held-out loss (nats per token, {base.train.eval_batches} batches of held-out chapters) and what became of each
run: diverged = the loss became NaN or infinite; stalled = the held-out loss ended within {STALL} nats of (or above)
the unigram baseline, {unigram:.2f} nats, the loss of predicting each token by its training frequency alone, so the
model learnt nothing beyond how common tokens are; trained = below that.

{table(header, rows)}

{_verdict(final, statuses)}
"""
    numbers: dict[str, Any] = {
        "final_loss": final,
        "status": statuses,
        "curves": {k: r.losses for k, r in results.items()},
        "unigram_loss": unigram,
        "steps": base.train.max_steps,
        "warmup_steps": warmup,
        "lr": base.train.lr,
        "d_model": model.d_model,
    }
    return Section("Pre-LN versus post-LN", LABELS, text, [_plot(results, unigram, ctx)], numbers)


def _cell(loss: float | None, state: str) -> str:
    return state if loss is None else f"{loss:.2f} ({state})"


def _verdict(final: dict[str, float | None], statuses: dict[str, str]) -> str:
    """What the runs show, in words chosen by the measurements."""
    lines = []
    if set(statuses.values()) == {"stalled"}:
        lines.append(
            "- Every run stalled: at this budget no run learnt more than token frequencies, so the arrangements "
            "cannot be told apart here; it takes longer training (the full mode, without --quick)."
        )
    else:
        for norm in NORMS:
            for schedule in SCHEDULES:
                by_state: dict[str, list[str]] = {}
                for depth in DEPTHS:
                    by_state.setdefault(statuses[f"{norm}-{schedule}-{depth}"], []).append(str(depth))
                summary = "; ".join(f"{state} at {', '.join(depths)} layers" for state, depths in by_state.items())
                lines.append(f"- {norm}-LN, {'with' if schedule == 'warmup' else 'without'} warm-up: {summary}.")
    gaps = [
        f"{depth} layers {post - pre:+.2f}"
        for depth in DEPTHS
        if (post := final[f"post-nowarmup-{depth}"]) is not None and (pre := final[f"pre-nowarmup-{depth}"]) is not None
    ]
    if gaps:
        lines.append(f"- Without warm-up, post-LN's final held-out loss minus pre-LN's: {', '.join(gaps)} nats.")
    return "\n".join(lines)
