"""One vector per sequence from a layer's token states: the mean over the real tokens, the
pooling sentence-transformers trains all-MiniLM-L6-v2 with (its embeddings are BERT's last
hidden states averaged under the attention mask, then L2-normalised), or the last real token's
(a causal model's classifier)."""

from __future__ import annotations

import torch
from torch import Tensor


def mean_pool(hidden: Tensor, mask: Tensor) -> Tensor:
    """hidden (B, T, d), mask (B, T) with 1 at real tokens -> (B, d): each row's mean over its
    real tokens (a row without any gives zeros)."""
    weights = mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


def last_pool(hidden: Tensor, mask: Tensor) -> Tensor:
    """hidden (B, T, d), mask (B, T) with 1 at real tokens -> (B, d): each row's state at its
    last real token, wherever the padding is (GPT-1's transfer reads a causal model there, the
    one position that has seen the whole sequence)."""
    positions = torch.arange(mask.shape[1], device=mask.device)
    last = (mask.to(torch.long) * (positions + 1)).argmax(dim=1)  # (B,): the rightmost 1
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


def normalize(vectors: Tensor) -> Tensor:
    """Each row scaled to unit L2 norm, so that a dot product is a cosine."""
    return torch.nn.functional.normalize(vectors, p=2.0, dim=-1)
