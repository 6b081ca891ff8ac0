"""What every objective shares: the interface, the loss it returns, collation and the one
token-level loss (label-smoothed cross entropy, ε = 0 being plain cross entropy).

Examples are token-id lists without special tokens; each objective adds its own specials,
pads with ``Specials.pad`` and marks positions that carry no loss with ``IGNORE_INDEX``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.data.specials import Specials
from attnkit.models.core import EncoderDecoderModel, Model, ModelOutput
from attnkit.nn.vocab_loss import IGNORE_INDEX

__all__ = ["IGNORE_INDEX", "LossOutput", "Objective", "from_vocab_loss", "label_smoothed_nll", "token_loss"]

Example = Sequence[int]  # token ids, no specials
Pair = tuple[Sequence[int], Sequence[int]]  # (source ids, target ids), no specials
E_contra = TypeVar("E_contra", contravariant=True)


@dataclass
class LossOutput:
    """One micro-batch's loss. The trainer divides ``total`` by ``tokens`` summed over
    micro-batches and ranks, so gradient accumulation and data parallelism are exact."""

    total: Tensor  # sum of the per-token losses over the target tokens (scalar, differentiable)
    tokens: int  # number of target tokens counted in ``total``
    metrics: dict[str, float]  # sums over the same tokens ("correct", "nll"): add across micro-batches


class Objective(Protocol[E_contra]):
    """A pre-training objective of [tab:att-families] (or translation): examples -> batch -> loss."""

    name: str

    def batch(self, examples: Sequence[E_contra], generator: torch.Generator) -> dict[str, Tensor]: ...

    def loss(self, model: Model, batch: dict[str, Tensor]) -> LossOutput: ...


def check_example(tokens: Example, specials: Specials) -> None:
    """Examples come without specials (``unk`` excepted: tokenizers emit it for unknown text)."""
    reserved = specials.all - {specials.unk}
    if not reserved.isdisjoint(tokens):
        bad = sorted(reserved.intersection(tokens))
        raise ValueError(
            f"example holds special token id(s) {bad}; pass plain token ids, the objective adds its own specials"
        )


def check_model(model: Model, kind: type[Model] | tuple[type[Model], ...], objective: str) -> None:
    """Each objective trains its assemblies; another would run but learn the wrong task
    (a bidirectional encoder sees the next token it is asked to predict)."""
    model = getattr(model, "module", model)  # DistributedDataParallel holds the model as .module
    if not isinstance(model, kind):
        kinds = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise ValueError(f"the {objective} objective trains a {kinds}, got a {type(model).__name__}")


def pad_batch(rows: Sequence[Sequence[int]], value: int) -> tuple[Tensor, Tensor]:
    """Right-pad ``rows`` to a (B, T_max) long tensor with ``value``; also the (B, T_max)
    attention mask, 1 = real token (the ecosystem's convention, as the models take it)."""
    if not rows:
        raise ValueError("cannot collate an empty list of examples; pass at least one")
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), value, dtype=torch.long)  # (B, T_max)
    mask = torch.zeros((len(rows), width), dtype=torch.long)  # (B, T_max)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids, mask


def encoder_decoder_batch(
    sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], specials: Specials
) -> dict[str, Tensor]:
    """Teacher forcing for an encoder–decoder ([fig:att-transformer], "Outputs (shifted right)").

    ``sources`` and ``targets`` are complete sequences (ending in ``eos``). The decoder reads
    the target shifted right behind the decoder start token (``bos``) and predicts the target:
    ``decoder_input_ids = [bos] + target[:-1]``, ``labels = target``.
    """
    input_ids, attention_mask = pad_batch(sources, specials.pad)  # (B, S)
    decoder_input_ids, decoder_attention_mask = pad_batch([[specials.bos, *t[:-1]] for t in targets], specials.pad)
    labels, _ = pad_batch(targets, IGNORE_INDEX)  # (B, T)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "decoder_input_ids": decoder_input_ids,
        "decoder_attention_mask": decoder_attention_mask,
        "labels": labels,
    }


def encoder_decoder_loss(
    model: Model, batch: dict[str, Tensor], specials: Specials, objective: str, epsilon: float = 0.0
) -> LossOutput:
    """The loss of an :func:`encoder_decoder_batch` on an encoder–decoder model."""
    check_model(model, EncoderDecoderModel, objective)
    start = getattr(model, "module", model).config.decoder_start_token_id  # .module: under DDP
    if start != specials.bos:
        raise ValueError(
            f"the model's decoder_start_token_id is {start}, but the {objective} objective starts "
            f"decoder inputs with bos={specials.bos}; build the model with decoder_start_token_id={specials.bos}"
        )
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        decoder_input_ids=batch["decoder_input_ids"],
        decoder_attention_mask=batch["decoder_attention_mask"],
        target_ids=batch["labels"],
        label_smoothing=epsilon,
    )
    return from_vocab_loss(out)


def from_vocab_loss(out: ModelOutput) -> LossOutput:
    """The :class:`LossOutput` of a forward pass given ``target_ids``: the head's fused loss
    over the target positions (:mod:`attnkit.nn.vocab_loss`; :func:`token_loss` is the same on
    materialised logits, and the tests hold the two equal)."""
    loss = out.vocab_loss
    assert loss is not None, "the model was called without target_ids"
    return LossOutput(loss.total, loss.tokens, {"correct": float(loss.correct), "nll": float(loss.nll)})


def label_smoothed_nll(
    logits: Tensor, labels: Tensor, epsilon: float, ignore_index: int = IGNORE_INDEX
) -> tuple[Tensor, int]:
    """Label-smoothed cross entropy, summed over the positions whose label is not ``ignore_index``.

    Per token: (1 - ε) · (-log p_y) + ε · mean_v(-log p_v), i.e. the cross entropy against
    (1 - ε) · onehot(y) + ε · uniform(V), the uniform distribution over the *whole* vocabulary
    (the true class included) mixed in, as in Szegedy et al. 2016 and the Transformer paper
    (ε = 0.1), and as ``torch.nn.functional.cross_entropy(label_smoothing=ε)`` computes it.
    fairseq's ``label_smoothed_cross_entropy`` spreads ε over the V - 1 wrong classes instead
    (ε / (V - 1) each); the two differ by O(ε / V). ε = 0 is plain cross entropy.

    The readable path, on materialised logits: the objectives train through the head's fused
    loss (:func:`attnkit.nn.vocab_loss.vocab_cross_entropy`), held equal to this by the tests.

    Shapes: logits (..., V), labels (...). Returns (sum of the losses, number of tokens).
    """
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"label smoothing epsilon must be in [0, 1), got {epsilon}")
    flat = logits.reshape(-1, logits.shape[-1]).float()  # (N, V)
    total = F.cross_entropy(
        flat, labels.reshape(-1), ignore_index=ignore_index, label_smoothing=epsilon, reduction="sum"
    )
    return total, int((labels != ignore_index).sum())


def token_loss(logits: Tensor, labels: Tensor, epsilon: float = 0.0) -> LossOutput:
    """The :class:`LossOutput` of (label-smoothed) cross entropy over the labelled positions,
    with the argmax predictions that are right ("correct") and the unsmoothed NLL ("nll") as metrics.

    Shapes: logits (B, T, V), labels (B, T) with ``IGNORE_INDEX`` where no loss is due.
    """
    total, tokens = label_smoothed_nll(logits, labels, epsilon)
    with torch.no_grad():
        flat, targets = logits.detach().reshape(-1, logits.shape[-1]), labels.reshape(-1)  # (N, V), (N,)
        keep = targets != IGNORE_INDEX  # (N,)
        correct = ((flat.argmax(dim=-1) == targets) & keep).sum()
        if epsilon == 0.0:
            nll = total.detach()
        else:  # -log p_y = logsumexp(z) - z_y: two reading passes, no (N, V) tensor written
            picked = flat.gather(-1, targets.clamp(min=0)[:, None]).squeeze(-1).float()  # (N,)
            nll = ((torch.logsumexp(flat.float(), dim=-1) - picked) * keep).sum()
    return LossOutput(total, tokens, {"correct": float(correct), "nll": float(nll)})
