"""Translation, the task of the encoder–decoder of [fig:att-transformer]: the source is
encoded, the decoder reads the target shifted right and predicts it token by token."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from attnkit.data.specials import Specials
from attnkit.models.core import Model
from attnkit.objectives.base import (
    LossOutput,
    Pair,
    check_example,
    encoder_decoder_batch,
    encoder_decoder_loss,
    label_smoothed_nll,
)

__all__ = ["Translation", "label_smoothed_nll"]


class Translation:
    """Supervised sequence-to-sequence training with label smoothing, as in the Transformer paper.

    A pair (src, tgt) becomes ``input_ids = src + [eos]``, ``decoder_input_ids = [bos] + tgt``
    (teacher forcing: [fig:att-transformer]'s "Outputs (shifted right)") and
    ``labels = tgt + [eos]``. The loss is the label-smoothed cross entropy with ε =
    ``label_smoothing`` (0.1 in the paper): the uniform distribution over the whole vocabulary
    mixed into the one-hot target, torch's form; fairseq's ε / (V - 1) variant differs slightly
    (see :func:`label_smoothed_nll`, the readable path on logits). Training computes it fused
    with the head (:func:`attnkit.nn.vocab_loss.vocab_cross_entropy`), tested equal.
    ``max_len`` (None = no limit) keeps the first ``max_len - 1`` tokens of each side, so the
    encoder input and the labels, ``eos`` included, are at most ``max_len`` long.
    """

    name = "translation"

    def __init__(self, specials: Specials, label_smoothing: float = 0.1, max_len: int | None = None) -> None:
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        if max_len is not None and max_len < 2:
            raise ValueError(f"max_len must leave room for a token and eos (at least 2) or be None, got {max_len}")
        self.specials, self.label_smoothing, self.max_len = specials, label_smoothing, max_len

    def batch(self, examples: Sequence[Pair], generator: torch.Generator | None = None) -> dict[str, Tensor]:
        """(source, target) id pairs -> the tensors of :func:`encoder_decoder_batch`; no randomness."""
        keep = None if self.max_len is None else self.max_len - 1
        sources, targets = [], []
        for src, tgt in examples:
            check_example(src, self.specials)
            check_example(tgt, self.specials)
            sources.append([*src[:keep], self.specials.eos])
            targets.append([*tgt[:keep], self.specials.eos])
        return encoder_decoder_batch(sources, targets, self.specials)

    def loss(self, model: Model, batch: dict[str, Tensor]) -> LossOutput:
        return encoder_decoder_loss(model, batch, self.specials, self.name, self.label_smoothing)
