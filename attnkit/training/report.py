"""What a translation run shows at the end: sacreBLEU of greedy and beam decoding on held-out
text and sample translations beside their references (the caller draws the cross-attention
alignment of the first, :func:`attnkit.chapter.alignment.plot_alignment`: training does not
import the chapter)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

from attnkit.data.tokenizer import decode, encode_batch
from attnkit.models.core import EncoderDecoderModel
from attnkit.training.evaluate import BEAM, translate_ids

# The demo's own decoding, chosen on the validation verses of a 10-minute translate-en-fr run
# (docs/translation.md, "Decoding"): α = 1.0 scored 0.4 BLEU above the paper's 0.6, and no
# 3-gram twice took the outputs that loop from 201 of 684 to 3 for 0.35 BLEU. The 3-grams are
# of words, as the loops are counted (:func:`repeats_a_trigram`): over token ids, a text's first
# word (spelt without its word mark) let 5 of t5-bible-tasks' 1,316 test outputs repeat one.
TUNED_BEAM = {
    "num_beams": 4,
    "length_penalty": 1.0,
    "length_penalty_style": "gnmt",
    "no_repeat_ngram_size": 3,
    "no_repeat_ngram_unit": "word",
}


@dataclass
class Scores:
    bleu: float
    chrf: float
    signature: str  # sacreBLEU's, so that the number can be reproduced
    hypotheses: list[str] = field(repr=False)


def score_translations(
    model: EncoderDecoderModel,
    tokenizer: Tokenizer,
    pairs: Sequence[tuple[str, str]],
    max_tokens: int,
    **options: object,
) -> Scores:
    """Translate the sources of ``pairs`` and score them against the references (sacreBLEU
    13a BLEU and chrF)."""
    import sacrebleu

    sources = [ids[: max_tokens - 2] for ids in encode_batch(tokenizer, [s for s, _ in pairs])]
    hypotheses = [decode(tokenizer, ids) for ids in translate_ids(model, sources, tokenizer=tokenizer, **options)]
    references = [[r for _, r in pairs]]
    bleu = sacrebleu.metrics.BLEU()
    score = bleu.corpus_score(hypotheses, references)
    chrf = sacrebleu.metrics.CHRF().corpus_score(hypotheses, references)
    return Scores(score.score, chrf.score, str(bleu.get_signature()), hypotheses)


@dataclass(frozen=True)
class TaskScores:
    """One text-to-text task's share of a scored run (its sources carry the task's prefix)."""

    sentences: int
    bleu: float
    chrf: float
    copy_bleu: float  # of the source unchanged, prefix removed: the bar a task that mostly copies must clear
    new_repeats: int  # outputs repeating a 3-gram where their reference repeats none


def by_task(pairs: Sequence[tuple[str, str]], hypotheses: Sequence[str]) -> dict[str, TaskScores]:
    """sacreBLEU and chrF of ``hypotheses`` for each task of ``pairs`` (sources without a known
    prefix under ""), beside the BLEU of copying each source."""
    import sacrebleu

    from attnkit.data.corpora import task_of

    rows: dict[str, list[int]] = {}
    for i, (source, _) in enumerate(pairs):
        rows.setdefault(task_of(source) or "", []).append(i)
    scores = {}
    for task, mine in rows.items():
        refs = [pairs[i][1] for i in mine]
        hyps = [hypotheses[i] for i in mine]
        copies = [pairs[i][0].removeprefix(f"{task}: ") for i in mine]
        scores[task] = TaskScores(
            len(mine),
            sacrebleu.corpus_bleu(hyps, [refs]).score,
            sacrebleu.corpus_chrf(hyps, [refs]).score,
            sacrebleu.corpus_bleu(copies, [refs]).score,
            new_repeats(hyps, refs),
        )
    return scores


def repeats_a_trigram(text: str) -> bool:
    words = text.split()
    grams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
    return len(grams) != len(set(grams))


def new_repeats(hypotheses: Sequence[str], references: Sequence[str]) -> int:
    """Outputs that repeat a 3-gram where their reference repeats none (a decoding loop)."""
    return sum(repeats_a_trigram(h) and not repeats_a_trigram(r) for h, r in zip(hypotheses, references, strict=True))


@dataclass
class TranslationReport:
    sentences: int
    greedy: Scores
    beam: Scores  # the paper's beam: 4, α = 0.6
    tuned: Scores  # TUNED_BEAM
    samples: list[tuple[str, str, str]]  # (source, reference, TUNED_BEAM translation)
    seconds: float


def translation_report(
    model: EncoderDecoderModel,
    tokenizer: Tokenizer,
    pairs: Sequence[tuple[str, str]],
    max_tokens: int,
    samples: int = 5,
) -> TranslationReport:
    """Score ``pairs`` with greedy decoding, the paper's beam 4 (α = 0.6) and
    :data:`TUNED_BEAM`, and keep a few samples of the last."""
    start = time.perf_counter()
    model.eval()
    greedy = score_translations(model, tokenizer, pairs, max_tokens, num_beams=1)
    beam = score_translations(model, tokenizer, pairs, max_tokens, **BEAM)
    tuned = score_translations(model, tokenizer, pairs, max_tokens, **TUNED_BEAM)
    shown = [(s, r, h) for (s, r), h in zip(pairs[:samples], tuned.hypotheses[:samples], strict=True)]
    return TranslationReport(len(pairs), greedy, beam, tuned, shown, time.perf_counter() - start)


def plot_training_curve(run_dir: Path, path: Path) -> Path:
    """Draw a run's training loss and learning rate against seconds of training, from its
    metrics.jsonl, into ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    steps = [r for r in map(json.loads, lines) if r["split"] == "train"]
    seconds = [r["seconds"] for r in steps]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(seconds, [r["loss"] for r in steps], label="training loss", color="tab:blue")
    if any(r.get("nll_rate", r["loss"]) != r["loss"] for r in steps):  # label smoothing: the loss is not the NLL
        ax.plot(seconds, [r.get("nll_rate") for r in steps], label="training NLL", color="tab:cyan", alpha=0.8)
    ax.set_xlabel("seconds of training")
    ax.set_ylabel("loss per target token")
    ax.grid(alpha=0.3)
    rate = ax.twinx()
    rate.plot(seconds, [r["lr"] for r in steps], color="tab:orange", label="learning rate")
    rate.set_ylabel("learning rate")
    handles = ax.get_legend_handles_labels()[0] + rate.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="upper right")
    ax.set_title(f"{run_dir.name}: training curve")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_confusion(confusion: list[list[int]], labels: tuple[str, ...], path: Path, title: str) -> Path:
    """Draw a classifier's confusion matrix (rows: the true class, columns: the predicted one),
    each cell's count written in it and shaded by its share of its row, into ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = [[int(n) for n in row] for row in confusion]
    shares = [[n / max(sum(row), 1) for n in row] for row in counts]
    size = max(4.0, 1.2 * len(labels) + 2.0)
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    image = ax.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0)
    for i, row in enumerate(counts):
        for j, n in enumerate(row):
            ax.text(j, i, f"{n:,}", ha="center", va="center", color="white" if shares[i][j] > 0.5 else "black")
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title, fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.046, label="share of the true class")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
