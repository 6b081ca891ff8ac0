"""What the heads of a trained translator attend to (chapter §Multi-Head Attention: "different
heads can attend according to different criteria at the same time — one tracking short-range
syntax, another long-range agreement, another positional neighbourhoods").

Each head [eq:att-head] has its own weights α [eq:att-alpha], and the concatenation
[eq:att-multihead] lets the next layer combine them. We read those weights, in the three
attentions of the encoder–decoder [fig:att-transformer], from a real translator (the one given
as ``ctx.model``, or one trained here on the numbers corpus) and measure every head of every
layer over many held-out sentences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import Tensor

from attnkit.chapter.alignment import cross_attention, pieces, plot_alignment
from attnkit.chapter.report import Context, Section, pyplot, save, table
from attnkit.config import RUN_PRESETS, RunConfig, apply_overrides, run_preset
from attnkit.data.prepare import encode, read_texts
from attnkit.data.tokenizer import specials_of
from attnkit.loading import from_pretrained
from attnkit.models.core import EncoderDecoderModel
from attnkit.models.run_dir import RUN_CONFIG, checkpoint_step, latest_checkpoint, read_run_config
from attnkit.training.run import make_objective, train

# The chapter's labels this experiment shows (docs/chapter.md's figure column reads them).
LABELS = ("eq:att-head", "eq:att-multihead", "eq:att-alpha", "fig:att-transformer", "alg:att-decode")
STEPS = {True: 150, False: 1500}  # numbers-en-de training steps: quick, full
SENTENCES = {True: 64, False: 256}  # held-out pairs the statistics average over
ALIGNED = 3  # held-out sentences drawn as alignments
BATCH = 32  # sentences per forward pass
# A head is named for the key (previous, same, next, first or last) that takes at least FOCUSED
# of its mass on average; else "sharp" if its mean entropy is at most SHARP nats (about two keys
# or fewer, chosen by content); else "local" if its mean distance is at most LOCAL tokens; else "broad".
FOCUSED = 0.5
SHARP = math.log(2.0)
LOCAL = 1.5
NAMES = {
    "prev": "previous-token", "same": "same-token", "next": "next-token", "first": "first-token", "last": "last-token",
}  # fmt: skip


@dataclass
class Translator:
    model: EncoderDecoderModel
    tokenizer: Tokenizer
    run: RunConfig  # whose data the held-out pairs come from
    pairs: list[tuple[str, str]]  # held-out (source, reference)
    source: str  # where the model came from, in words
    trained_steps: int | None  # None: a model directory, whose history is unknown


def _held_out(run: RunConfig) -> list[tuple[str, str]]:
    texts = read_texts(run)
    return texts.test or texts.valid  # user files have no test split


def _given(path: str) -> Translator:
    """``ctx.model``: a run directory (its data's held-out test split) or a model directory
    (the held-out split of the main job's data, English -> French Bible verses)."""
    model = from_pretrained(path)
    if not isinstance(model, EncoderDecoderModel) or model.tokenizer is None:
        raise ValueError(f"{path}: the heads experiment needs a trained encoder–decoder with its tokenizer")
    if (Path(path) / RUN_CONFIG).exists():
        run = read_run_config(path)[0]
        checkpoint = latest_checkpoint(Path(path))
        steps = checkpoint_step(checkpoint) if checkpoint is not None else None
        return Translator(model, model.tokenizer, run, _held_out(run), f"the run `{path}`", steps)
    run = run_preset("translate-en-fr")
    source = f"the model `{path}` (sentences: the held-out verses of the translate-en-fr data)"
    return Translator(model, model.tokenizer, run, _held_out(run), source, None)


def _trained(ctx: Context) -> Translator:
    """A numbers-en-de translator trained into ``ctx.out / heads-translator`` (reusable as ``--model``)."""
    steps = STEPS[ctx.quick]
    changes = {"max_steps": steps, "checkpoint_every": steps, "keep_checkpoints": 1, "seed": ctx.seed}
    run = apply_overrides(run_preset("numbers-en-de"), {f"train.{k}": str(v) for k, v in changes.items()})
    run_dir = ctx.out / "heads-translator"
    progress, _ = train(run, run_dir, force=True, progress_bar=False)
    model = from_pretrained(run_dir)
    source = f"a {RUN_PRESETS['numbers-en-de'][0]} translator trained here (`{run_dir.name}/`, preset numbers-en-de)"
    return Translator(model, model.tokenizer, run, _held_out(run), source, progress.step)


@torch.no_grad()
def attentions(translator: Translator, pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Teacher-forced forward passes over ``pairs`` (the decoder reads the reference), in
    batches: per batch {kind: ([per layer (B, H, T_q, T_k)] weights, (B, T_q) real queries,
    (B, T_k) real keys)}."""
    model, run = translator.model, translator.run
    objective = make_objective(run, specials_of(translator.tokenizer))
    examples = encode(translator.tokenizer, pairs, run.data.max_tokens)
    out = []
    for start in range(0, len(examples), BATCH):
        batch = objective.batch(examples[start : start + BATCH], torch.Generator())
        record = model(
            batch["input_ids"], batch["attention_mask"], batch["decoder_input_ids"], batch["decoder_attention_mask"],
            output_attentions=True,
        ).attentions  # fmt: skip
        source, target = batch["attention_mask"].bool(), batch["decoder_attention_mask"].bool()  # (B, S), (B, T)
        out.append({
            "encoder-self": (record["encoder"]["self"], source, source),
            "decoder-self": (record["decoder"]["self"], target, target),
            "cross": (record["decoder"]["cross"], target, source),
        })  # fmt: skip
    return out


def head_statistics(batches: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, dict[str, float]]]:
    """Per (kind, layer, head), averaged over every real query position of every sentence:
    the mean attention distance Σ_j α_ij |i − j|, the entropy −Σ_j α_ij ln α_ij (nats), and
    the mass on the key just before, at and just after the query's position (prev, same, next)
    and on the sequence's first and last real key (first, last). Also, per kind, the same
    measures of uniform attention over the keys each query may see: the baseline."""
    sums: dict[tuple[str, int], Tensor] = {}  # (kind, layer) -> (H, 7) sums over queries; layer 0: uniform
    counts: dict[str, int] = {}
    for batch in batches:
        for kind, (layers, queries, keys) in batch.items():
            counts[kind] = counts.get(kind, 0) + int(queries.sum())
            T, S = queries.shape[1], keys.shape[1]
            j = torch.arange(S)
            rel = j[None, :] - torch.arange(T)[:, None]  # (T, S): j - i
            at = {
                "prev": rel == -1, "same": rel == 0, "next": rel == 1, "first": j == 0,
                "last": (j == keys.sum(1, keepdim=True) - 1)[:, None, None, :],  # (B, 1, 1, S)
            }  # fmt: skip
            causal = rel <= 0 if kind == "decoder-self" else torch.ones_like(rel, dtype=torch.bool)
            visible = (keys[:, None, :] & causal)[:, None].float()  # (B, 1, T, S)
            uniform = visible / visible.sum(-1, keepdim=True)
            for layer, weights in [*enumerate(layers, start=1), (0, uniform)]:  # (B, H, T, S)
                per_query = [
                    (weights * rel.abs()).sum(-1),  # (B, H, T)
                    -(weights * weights.clamp_min(1e-12).log()).sum(-1),
                    *((weights * mask).sum(-1) for mask in at.values()),
                ]
                stats = torch.stack(per_query, -1) * queries[:, None, :, None]  # (B, H, T, 7), pad rows zeroed
                sums[kind, layer] = sums.get((kind, layer), 0) + stats.sum((0, 2))  # (H, 7)
    heads, uniform = [], {}
    for (kind, layer), total in sums.items():
        for head, row in enumerate((total / counts[kind]).tolist()):
            values = dict(zip(("distance", "entropy", *NAMES), row, strict=True))
            if layer == 0:
                uniform[kind] = values
            else:
                heads.append({"kind": kind, "layer": layer, "head": head + 1, **values, "class": classify(values)})
    return heads, uniform


def classify(values: dict[str, float]) -> str:
    """The head's kind by the thresholds FOCUSED, SHARP and LOCAL (see the module's constants)."""
    focus = max(NAMES, key=lambda name: values[name])
    if values[focus] >= FOCUSED:
        return NAMES[focus]
    if values["entropy"] <= SHARP:
        return "sharp"
    return "local" if values["distance"] <= LOCAL else "broad"


def _name(head: dict[str, Any]) -> str:
    return f"{head['kind']} {head['layer']}.{head['head']}"


def _plot_heads(translator: Translator, ctx: Context) -> str:
    """Every head's self-attention weights for the first held-out sentence: a row per encoder
    and decoder layer, a column per head."""
    plt = pyplot()
    pair = translator.pairs[0]
    (batch,) = attentions(translator, [pair])
    source, target = encode(translator.tokenizer, [pair], translator.run.data.max_tokens)[0]
    eos, bos = translator.model.config.eos_token_id, translator.model.config.decoder_start_token_id
    labels = {
        "encoder-self": (pieces(translator.tokenizer, [*source, eos]),) * 2,
        "decoder-self": (pieces(translator.tokenizer, [bos, *target]),) * 2,
    }
    rows = [(kind, layer, w[0]) for kind in labels for layer, w in enumerate(batch[kind][0])]  # w[0]: (H, T, T)
    H = rows[0][2].shape[0]
    fig, axes = plt.subplots(len(rows), H, figsize=(2.6 * H, 2.6 * len(rows)), squeeze=False)
    for r, (kind, layer, weights) in enumerate(rows):
        queries, keys = labels[kind]
        for h in range(H):
            ax = axes[r][h]
            ax.imshow(weights[h].numpy(), cmap="viridis", vmin=0.0, vmax=1.0)
            ax.set_title(f"{kind}, layer {layer + 1}, head {h + 1}", fontsize=7)
            ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=5)
            ax.set_yticks(range(len(queries)), queries if h == 0 else [], fontsize=5)
    fig.suptitle(f"self-attention of every head on “{pair[0]}” → “{pair[1]}”", fontsize=9)
    fig.tight_layout()
    return save(fig, ctx, "heads-self-attention.png")


def _plot_specialisation(heads: list[dict[str, Any]], ctx: Context) -> str:
    """Each head as a point (mean distance, entropy), marked by kind, labelled layer.head."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for kind, marker in (("encoder-self", "o"), ("decoder-self", "s"), ("cross", "^")):
        mine = [h for h in heads if h["kind"] == kind]
        ax.scatter([h["distance"] for h in mine], [h["entropy"] for h in mine], marker=marker, label=kind)
        for h in mine:
            ax.annotate(f"{h['layer']}.{h['head']}", (h["distance"], h["entropy"]), fontsize=7)
    ax.axvline(LOCAL, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("mean attention distance Σ_j α_ij |i − j| (tokens)")
    ax.set_ylabel("mean entropy of α_i· (nats)")
    ax.legend(fontsize=8)
    ax.set_title("per-head specialisation (labels: layer.head)")
    return save(fig, ctx, "heads-specialisation.png")


def _table(heads: list[dict[str, Any]]) -> str:
    columns = ["distance", "entropy", *NAMES]
    header = ["attention", "layer", "head", *columns, "class"]
    rows = [[h["kind"], str(h["layer"]), str(h["head"]), *(f"{h[c]:.2f}" for c in columns), h["class"]] for h in heads]
    return table(header, rows)


# One experiment, read top to bottom as its report section reads: the translator, its attention,
# the statistics, the figures, the prose; the work is in the functions above.
def run(ctx: Context) -> Section:
    torch.manual_seed(ctx.seed)
    translator = _given(ctx.model) if ctx.model else _trained(ctx)
    measured = translator.pairs[: SENTENCES[ctx.quick]]
    batches = attentions(translator, measured)
    heads, uniform = head_statistics(batches)
    lengths = {  # mean tokens per sentence, specials included
        side: sum(int(b[kind][1].sum()) for b in batches) / len(measured)
        for side, kind in (("source", "encoder-self"), ("target", "decoder-self"))
    }
    figures, alignments = [], []
    for k, (source, _) in enumerate(translator.pairs[:ALIGNED], start=1):
        path = plot_alignment(translator.model, translator.tokenizer, source, ctx.out / f"heads-alignment-{k}.png")
        figures.append(path.name)
        src, tgt, weights = cross_attention(translator.model, translator.tokenizer, source)
        alignments.append({"source": src, "target": tgt, "weights": weights[-1].mean(0).tolist()})  # last layer, (T, S)
    figures += [_plot_heads(translator, ctx), _plot_specialisation(heads, ctx)]

    steps = translator.trained_steps
    named = [h for h in heads if h["class"] != "broad"]
    by_class = {c: [h for h in heads if h["class"] == c] for c in dict.fromkeys(h["class"] for h in heads)}
    summary = "; ".join(f"{c}: {len(hs)} ({', '.join(map(_name, hs))})" for c, hs in by_class.items())
    trained = f"{steps} steps" if steps is not None else "an unknown number of steps"
    layers = len({(h["kind"], h["layer"]) for h in heads})
    text = f"""
The model: {translator.source}, trained for {trained}. Its {len(heads)} heads ({layers} attention layers of
{translator.model.config.n_heads} heads each [eq:att-head]: the encoder's self-attention, the decoder's masked
self-attention and its cross-attention to the encoder, as in [fig:att-transformer]) were measured on
{len(measured)} held-out sentence pairs, the decoder reading the reference (teacher forcing); the sentences average
{lengths["source"]:.1f} source and {lengths["target"]:.1f} target tokens, `</s>` and `<s>` included. For each head
and each real query position i we take its weights α_i· [eq:att-alpha] and average over all queries of all
sentences: the mean attention distance Σ_j α_ij |i − j| (for cross-attention i is the target and j the source
position, so distance 0 is the diagonal), the entropy −Σ_j α_ij ln α_ij in nats, and the mass on the key just before,
at and just after the query's own position (prev, same, next) and on the sequence's first and last real key (first,
last: the source's `</s>` for the encoder and cross-attention, the decoder's start token `<s>` for its first).

A head is named for the key of those five that holds at least {FOCUSED:.2f} of its mass on average (previous-token,
same-token, next-token, first-token, last-token); otherwise it is sharp if its mean entropy is at most
ln 2 = {SHARP:.2f} nats (about two keys or fewer, chosen by content rather than position), local if its mean distance
is at most {LOCAL:.1f} tokens, and broad if none of these holds. {len(named)} of {len(heads)} heads specialise by this
measure (are not broad). By class: {summary}.

For comparison, uniform attention over the keys each query may see would give
{"; ".join(f"{kind}: distance {u['distance']:.2f}, entropy {u['entropy']:.2f}" for kind, u in uniform.items())}.

{_table(heads)}

The alignment figures show the last decoder layer's cross-attention for the first {ALIGNED} held-out sentences
(greedy translation), averaged over heads beside each head; the self-attention figure shows every head of every
layer on the first held-out pair; the last figure places each head by its mean distance and entropy.
"""
    numbers = {
        "model": translator.source,
        "trained_steps": steps,
        "sentences": len(measured),
        "mean_tokens": lengths,
        "thresholds": {"focused": FOCUSED, "sharp_entropy": SHARP, "local_distance": LOCAL},
        "heads": heads,
        "uniform": uniform,
        "alignments": alignments,
    }
    return Section("What the heads attend to", LABELS, text, figures, numbers)
