"""Sequence classification, BERT's *understanding* at work ([tab:att-families]): fine-tune an
encoder with its classification head on labelled texts, or a GPT reading its last token
(GPT-1's transfer)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.models.core import DecoderOnlyModel, EncoderOnlyModel, Model
from attnkit.objectives.base import LossOutput, check_model, pad_batch

Labeled = tuple[Sequence[int], int]  # (token ids with the tokenizer's own specials, class index)


class Classify:
    """Cross entropy of the class logits of each whole example; ``correct`` counts the
    examples whose argmax is their label (``correct_rate`` is the accuracy)."""

    name = "classify"

    def __init__(self, pad: int) -> None:
        self.pad = pad

    def batch(self, examples: Sequence[Labeled], generator: torch.Generator | None = None) -> dict[str, Tensor]:
        """Examples -> ``input_ids``, ``attention_mask`` (B, T) and ``labels`` (B,)."""
        input_ids, attention_mask = pad_batch([list(ids) for ids, _ in examples], self.pad)
        return {"input_ids": input_ids, "attention_mask": attention_mask,
                "labels": torch.tensor([label for _, label in examples])}  # fmt: skip

    def loss(self, model: Model, batch: dict[str, Tensor]) -> LossOutput:
        check_model(model, (EncoderOnlyModel, DecoderOnlyModel), self.name)
        if getattr(model, "classifier", None) is None:
            raise ValueError("classification needs a model with a classification head: set model.labels")
        logits = model(batch["input_ids"], batch["attention_mask"]).logits  # (B, classes)
        labels = batch["labels"]
        total = F.cross_entropy(logits.float(), labels, reduction="sum")
        correct = float((logits.argmax(-1) == labels).sum())
        return LossOutput(total, int(labels.numel()), {"correct": correct})
