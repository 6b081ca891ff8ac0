"""Masked language modelling, BERT's objective in [tab:att-families]."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from attnkit.data.specials import Specials
from attnkit.models.core import EncoderOnlyModel, Model
from attnkit.objectives.base import (
    IGNORE_INDEX,
    Example,
    LossOutput,
    check_example,
    check_model,
    from_vocab_loss,
    pad_batch,
)

# Of the chosen positions (Devlin et al. 2019, §3.1): 80% become the mask token, 10% a random
# token, 10% stay unchanged, so the encoder cannot rely on seeing the mask to know where to predict.
MASK_SHARE, RANDOM_SHARE = 0.8, 0.1


class MaskedLM:
    """Hide a fraction of the tokens and reconstruct them from both sides of context.

    An example x becomes ``[bos] + x + [eos]`` ([CLS] x [SEP]). In each sequence exactly
    ``k = max(1, round(mask_prob · n))`` of its n ordinary positions (not a special token,
    ``unk`` included) are chosen, uniformly without replacement — the count of Google's
    ``create_pretraining_data.py``, which guarantees every sequence a loss term; Hugging Face's
    collator instead draws Bernoulli(mask_prob) per position. ``round`` is Python's (half to
    even). Of the chosen: 80% -> ``mask``, 10% -> a uniformly random non-special token of
    ``[0, vocab_size)``, 10% unchanged, decided independently per position. ``labels`` hold the
    original token at chosen positions and ``IGNORE_INDEX`` elsewhere, so the loss counts only
    those. ``vocab_size`` (None = ``specials.vocab_size``) bounds the random tokens: the
    tokenizer's vocabulary when the model's embedding table is padded beyond it.
    """

    name = "masked_lm"

    def __init__(self, specials: Specials, vocab_size: int | None = None, mask_prob: float = 0.15) -> None:
        if not 0.0 < mask_prob <= 1.0:
            raise ValueError(f"mask_prob must be in (0, 1], got {mask_prob}")
        vocab_size = specials.vocab_size if vocab_size is None else vocab_size
        ordinary = [i for i in range(vocab_size) if i not in specials.all]
        if not ordinary:
            raise ValueError(
                f"vocab_size={vocab_size} leaves no ordinary token to draw random replacements from; "
                f"pass the vocabulary size, larger than the {len(specials.all)} specials"
            )
        self.specials, self.mask_prob = specials, mask_prob
        self.ordinary = torch.tensor(ordinary)  # (V_ordinary,) ids a random replacement may take
        self.special_ids = torch.tensor(sorted(specials.all))

    def batch(self, examples: Sequence[Example], generator: torch.Generator) -> dict[str, Tensor]:
        """Examples -> ``input_ids`` (corrupted), ``attention_mask``, ``token_type_ids`` (zeros)
        and ``labels``, all (B, T); every random draw comes from ``generator``."""
        rows = []
        for x in examples:
            check_example(x, self.specials)
            rows.append([self.specials.bos, *x, self.specials.eos])
        original, attention_mask = pad_batch(rows, self.specials.pad)  # (B, T)
        candidate = ~torch.isin(original, self.special_ids)  # (B, T) ordinary positions
        n = candidate.sum(dim=1)  # (B,)
        k = torch.minimum(torch.round(n.double() * self.mask_prob).long().clamp(min=1), n)  # (B,) to choose

        # A uniformly random k-subset of each row's candidates: rank random scores, with every
        # non-candidate scored above every candidate so it is never among the k lowest.
        scores = torch.rand(original.shape, generator=generator).masked_fill(~candidate, 2.0)  # (B, T)
        ranks = scores.argsort(dim=1).argsort(dim=1)  # (B, T) rank of each position in its row
        chosen = ranks < k.unsqueeze(1)  # (B, T)

        fate = torch.rand(original.shape, generator=generator)  # (B, T) uniform: which of 80/10/10
        to_mask = chosen & (fate < MASK_SHARE)
        to_random = chosen & (fate >= MASK_SHARE) & (fate < MASK_SHARE + RANDOM_SHARE)
        random_ids = self.ordinary[torch.randint(len(self.ordinary), original.shape, generator=generator)]  # (B, T)
        input_ids = original.masked_fill(to_mask, self.specials.mask)
        input_ids = torch.where(to_random, random_ids, input_ids)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "token_type_ids": torch.zeros_like(input_ids),
            "labels": original.masked_fill(~chosen, IGNORE_INDEX),
        }

    def loss(self, model: Model, batch: dict[str, Tensor]) -> LossOutput:
        check_model(model, EncoderOnlyModel, self.name)
        if getattr(model, "module", model).head is None:  # .module: under DDP
            raise ValueError("masked language modelling needs the MLM head; build the model with lm_head=True")
        out = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            token_type_ids=batch["token_type_ids"],
            target_ids=batch["labels"],
        )
        return from_vocab_loss(out)
