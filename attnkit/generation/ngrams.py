"""A decoding constraint: no n-gram twice in one output (``no_repeat_ngram_size``, as in
``transformers``' ``NoRepeatNGramLogitsProcessor`` and fairseq), the usual cure for the loops
that an under-trained translator falls into ("Voici, j'ai dit: Voici, j'ai dit: ...")."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

# (next-token scores (N, V), what each row has read so far (N, L): the prompt or start token
# and the new tokens) -> the scores to choose from
Constraint = Callable[[Tensor, Tensor], Tensor]


def repeated_ngram_bans(sequences: Tensor, n: int, vocab_size: int) -> Tensor:
    """Which next tokens would complete an n-gram that already occurs in each row.

    Shapes: ``sequences`` (N, L) token ids -> (N, V) bool, True = banned. A token is banned in
    row r when the row's last n - 1 tokens followed by it form one of the row's n-grams; with
    n = 1 every token of the row is banned. Rows shorter than n - 1 tokens ban nothing.
    """
    if n < 1:
        raise ValueError(f"no_repeat_ngram_size must be >= 1, got {n}")
    N, L = sequences.shape
    banned = torch.zeros(N, vocab_size, dtype=torch.bool, device=sequences.device)
    if n > L:  # not one whole n-gram yet
        return banned
    windows = sequences.unfold(1, n, 1)  # (N, L) -> (N, L - n + 1, n): every n-gram of each row
    last = sequences[:, L - n + 1 :]  # (N, n - 1): the prefix the next token would complete
    matches = (windows[:, :, :-1] == last[:, None, :]).all(dim=-1)  # (N, L - n + 1)
    rows, which = matches.nonzero(as_tuple=True)
    banned[rows, windows[rows, which, -1]] = True
    return banned


def no_repeat_ngram(n: int) -> Constraint:
    """The constraint that bans repeating an n-gram of what a row has read: banned scores
    become -inf. What it has read is the prompt (decoder-only) or the start token
    (encoder-decoder) and the new tokens, as ``transformers`` counts."""

    def constrain(scores: Tensor, sequences: Tensor) -> Tensor:
        return scores.masked_fill(repeated_ngram_bans(sequences, n, scores.shape[-1]), float("-inf"))

    return constrain
