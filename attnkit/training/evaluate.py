"""Evaluation during and after training: loss and perplexity on held-out examples, the
objective's accuracy where it counts one (MLM), and for translation BLEU with greedy and beam
decoding, scored by sacreBLEU."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from tokenizers import Tokenizer

from attnkit.config import RunConfig
from attnkit.data.batching import TokenBatches
from attnkit.data.padding import length_sorted, pad_right
from attnkit.data.prepare import costs
from attnkit.data.tokenizer import decode
from attnkit.generation import generate_with_defaults
from attnkit.models.core import Model
from attnkit.objectives.base import IGNORE_INDEX, Objective

BLEU_SENTENCES = 200  # held-out pairs decoded for BLEU at each evaluation
BEAM = {"num_beams": 4, "length_penalty": 0.6, "length_penalty_style": "gnmt"}  # the paper's


@torch.no_grad()
def evaluate(
    model: Model,
    objective: Objective,
    examples: Sequence[Any],
    run: RunConfig,
    tokenizer: Tokenizer | None = None,
    bleu: bool = False,
) -> dict[str, float]:
    """Loss and perplexity over up to ``train.eval_batches`` held-out batches, plus the
    objective's rates (``correct_rate``: MLM accuracy, next-token accuracy); with ``bleu`` and
    a translation objective, BLEU of greedy and beam-4 decoding."""

    was_training = model.training
    model.eval()
    batches = TokenBatches(costs(examples), run.train.batch_tokens, run.train.seed, shuffle=False)
    total, tokens, sums = 0.0, 0, {}
    device = next(model.parameters()).device
    for i, indices in enumerate(b.tolist() for b in batches.epoch_arrays(0)[: run.train.eval_batches]):
        generator = torch.Generator().manual_seed(run.train.seed + i)
        batch = {k: v.to(device) for k, v in objective.batch([examples[j] for j in indices], generator).items()}
        out = objective.loss(model, batch)
        total += float(out.total)
        tokens += int((batch["labels"] != IGNORE_INDEX).sum())
        for k, v in out.metrics.items():
            sums[k] = sums.get(k, 0.0) + v
    loss = total / max(tokens, 1)
    result = {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "tokens": tokens}
    result.update({f"{k}_rate": v / max(tokens, 1) for k, v in sums.items()})
    if bleu and run.objective == "translation" and tokenizer is not None:
        pairs = list(examples[:BLEU_SENTENCES])
        result["bleu_greedy"] = translation_bleu(model, tokenizer, pairs, num_beams=1)
        result["bleu_beam4"] = translation_bleu(model, tokenizer, pairs, **BEAM)
    model.train(was_training)
    return result


# A translation stops at its source length + this many tokens (the paper's, section 6.1).
SOURCE_LENGTH_OFFSET = 50


def translate_ids(
    model: Model, sources: Sequence[Sequence[int]], batch_size: int = 32, **options: Any
) -> list[list[int]]:
    """Decode token-id sources (without their end token) in batches of similar length; returns
    the new ids of each, in the order of ``sources``."""
    eos, pad = model.config.eos_token_id, model.config.pad_token_id
    device = next(model.parameters()).device
    outputs: list[list[int]] = [[] for _ in sources]
    for batch in length_sorted([len(s) for s in sources], batch_size):
        ids, mask = pad_right([[*sources[i], eos] for i in batch], pad, device)  # + eos, as the objective trained
        out = generate_with_defaults(  # model.generate, which only attnkit.generation's import gives the model
            model, ids, mask, max_new_tokens=ids.shape[1] + SOURCE_LENGTH_OFFSET,
            source_length_offset=SOURCE_LENGTH_OFFSET,
            **options,
        )  # fmt: skip
        for i, row in zip(batch, out[:, 1:].tolist(), strict=True):  # drop the start token
            row = row[: len(sources[i]) + 1 + SOURCE_LENGTH_OFFSET]  # its own cap, not the batch's
            outputs[i] = row[: row.index(eos)] if eos in row else row
    return outputs


def translation_bleu(
    model: Model, tokenizer: Tokenizer, pairs: Sequence[tuple[list[int], list[int]]], **options: Any
) -> float:
    """Corpus BLEU (sacreBLEU, 13a tokenisation) of the model's translations of ``pairs``."""
    import sacrebleu

    hypotheses = [decode(tokenizer, ids) for ids in translate_ids(model, [s for s, _ in pairs], **options)]
    references = [decode(tokenizer, target) for _, target in pairs]
    return sacrebleu.corpus_bleu(hypotheses, [references]).score


@torch.no_grad()
def classification_scores(
    model: Model, examples: Sequence[tuple[Sequence[int], int]], classes: int, batch_size: int = 32
) -> dict[str, Any]:
    """Accuracy, macro-F1 (the mean of 2·precision·recall / (precision + recall) over the classes
    present or predicted, as scikit-learn's: a class the split never holds nor the model names,
    e.g. a book with no held-out chapter, is left out, not counted 0) and the confusion matrix (rows: the true
    class, columns: the predicted one) of ``model``'s predictions of (ids, class) examples."""
    was_training = model.training
    model.eval()
    confusion = torch.zeros(classes, classes, dtype=torch.long)
    for batch, out, _ in model.batched([ids for ids, _ in examples], batch_size):  # type: ignore[attr-defined]
        for i, guess in zip(batch.tolist(), out.logits.argmax(-1).tolist(), strict=True):
            confusion[examples[i][1], guess] += 1
    model.train(was_training)
    hits = confusion.diagonal().double()
    precision = hits / confusion.sum(0).clamp(min=1)
    recall = hits / confusion.sum(1).clamp(min=1)
    f1 = torch.where(precision + recall > 0, 2 * precision * recall / (precision + recall), torch.zeros_like(hits))
    seen = (confusion.sum(0) + confusion.sum(1)) > 0
    macro = float(f1[seen].mean()) if bool(seen.any()) else 0.0
    return {"accuracy": float(hits.sum() / max(int(confusion.sum()), 1)), "macro_f1": macro,
            "confusion": confusion.tolist()}  # fmt: skip
