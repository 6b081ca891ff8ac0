"""Batches of token-id rows for a model to read many inputs at once (decoding, evaluating,
embedding): sorted by length, padded on the right (sources) or on the left (prompts)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def length_sorted(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """The indices of ``lengths`` in batches of ``batch_size`` of similar length, longest first.

    A batch of similar sources pads little and its rows finish close together; the caller
    writes each output back at its index, so the outputs keep the input order. Equal lengths
    keep their input order (a stable sort).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def pad_right(
    sequences: Sequence[Sequence[int]], pad: int, device: torch.device | None = None
) -> tuple[Tensor, Tensor]:
    """Token-id lists as ``(ids, attention_mask)``, both (N, longest), padded on the right."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = torch.as_tensor(sequence, dtype=torch.long)
        mask[row, : len(sequence)] = 1
    return ids.to(device), mask.to(device)


def pad_left(sequences: Sequence[Sequence[int]], pad: int, device: torch.device | None = None) -> tuple[Tensor, Tensor]:
    """Token-id lists as ``(ids, attention_mask)``, both (N, longest), padded on the left: every
    prompt ends at the last column, where a decoder-only model continues it."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, sequence in enumerate(sequences):
        ids[row, width - len(sequence) :] = torch.as_tensor(sequence, dtype=torch.long)
        mask[row, width - len(sequence) :] = 1
    return ids.to(device), mask.to(device)


def positions(real: Tensor) -> Tensor:
    """Position ids (N, T) of left-padded rows: each row counts from its first real token
    (``real``: 1/True at real tokens); padding takes position 0."""
    return (real.long().cumsum(-1) - 1).clamp(min=0)
