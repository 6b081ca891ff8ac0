"""Next-token prediction, GPT's objective in [tab:att-families]."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from attnkit.data.specials import Specials
from attnkit.models.core import DecoderOnlyModel, Model
from attnkit.objectives.base import (
    IGNORE_INDEX,
    Example,
    LossOutput,
    check_example,
    check_model,
    from_vocab_loss,
    pad_batch,
)


class CausalLM:
    """Maximise the autoregressive log-likelihood Σ_t log p(x_t | x_<t) of [tab:att-families]
    under the causal mask [eq:att-mask].

    An example x becomes ``seq = [bos] + x + [eos]``; the model reads ``input_ids = seq[:-1]``
    and predicts ``labels = seq[1:]`` at every position (the first token is predicted from
    ``bos``, and ``eos`` ends the text). Padding carries no loss.
    """

    name = "causal_lm"

    def __init__(self, specials: Specials) -> None:
        self.specials = specials

    def batch(self, examples: Sequence[Example], generator: torch.Generator | None = None) -> dict[str, Tensor]:
        """Examples -> ``input_ids``, ``attention_mask``, ``labels`` (B, T); no randomness."""
        sequences = []
        for x in examples:
            check_example(x, self.specials)
            sequences.append([self.specials.bos, *x, self.specials.eos])
        input_ids, attention_mask = pad_batch([seq[:-1] for seq in sequences], self.specials.pad)  # (B, T)
        labels, _ = pad_batch([seq[1:] for seq in sequences], IGNORE_INDEX)  # (B, T)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}

    def loss(self, model: Model, batch: dict[str, Tensor]) -> LossOutput:
        check_model(model, DecoderOnlyModel, self.name)
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], target_ids=batch["labels"])
        return from_vocab_loss(out)
