"""The decoding constraints a checkpoint's generation config may ask for, besides
:mod:`~attnkit.generation.ngrams`: banned words and forced first or last tokens. Each
rewrites the next-token scores (N, V) given what each row has read (N, L) and which rows take
their final token (N,), as
``transformers``' logits processors do, and they compose in its order."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from attnkit.generation.ngrams import Constraint


def bad_words(words: Sequence[Sequence[int]]) -> Constraint:
    """Never complete one of ``words`` (token-id sequences): a one-token word is always
    banned, a longer one's last token is banned where the row ends with the rest of it
    (``bad_words_ids``; Marian bans its pad token this way)."""
    single = sorted({w[0] for w in words if len(w) == 1})
    longer = [list(w) for w in words if len(w) > 1]

    def constrain(scores: Tensor, sequences: Tensor, final: Tensor) -> Tensor:
        banned = torch.zeros_like(scores, dtype=torch.bool)
        if single:
            banned[:, single] = True
        for word in longer:
            prefix = torch.tensor(word[:-1], device=sequences.device)
            if sequences.shape[1] >= len(prefix):
                ends_with = (sequences[:, sequences.shape[1] - len(prefix) :] == prefix).all(dim=1)  # (N,)
                banned[ends_with, word[-1]] = True
        return scores.masked_fill(banned, float("-inf"))

    return constrain


def forced(token: int, step: int, read_before: int) -> Constraint:
    """Force ``token`` as new token number ``step`` (0-based): every other score -inf there.
    ``read_before``: the length of what a row had read before its first new token."""

    def constrain(scores: Tensor, sequences: Tensor, final: Tensor) -> Tensor:
        if sequences.shape[1] - read_before != step:
            return scores
        only = torch.full_like(scores, float("-inf"))
        only[:, token] = 0.0
        return only

    return constrain


def chain(constraints: Sequence[Constraint]) -> Constraint | None:
    """The constraints applied in order; None when there are none."""
    if not constraints:
        return None
    if len(constraints) == 1:
        return constraints[0]

    def constrain(scores: Tensor, sequences: Tensor, final: Tensor) -> Tensor:
        for constraint in constraints:
            scores = constraint(scores, sequences, final)
        return scores

    return constrain
