"""The shared loss: label-smoothed cross entropy against a hand computation, ε = 0 as plain
cross entropy, and no loss (nor gradient) at ignored positions."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnkit.objectives import IGNORE_INDEX, label_smoothed_nll, token_loss
from attnkit.objectives.base import pad_batch


def test_label_smoothing_matches_hand_computed_value() -> None:
    logits = torch.tensor([[1.0, 2.0, 0.5], [0.0, -1.0, 3.0], [5.0, 5.0, 5.0]])
    labels = torch.tensor([1, 0, IGNORE_INDEX])
    eps = 0.1

    def by_hand(z: list[float], y: int) -> float:
        log_z = math.log(sum(math.exp(v) for v in z))
        nll = log_z - z[y]
        uniform = sum(log_z - v for v in z) / len(z)  # mean over the vocabulary of -log p_v
        return (1 - eps) * nll + eps * uniform

    expected = by_hand([1.0, 2.0, 0.5], 1) + by_hand([0.0, -1.0, 3.0], 0)
    total, tokens = label_smoothed_nll(logits, labels, eps)
    assert tokens == 2
    assert total.item() == pytest.approx(expected, rel=1e-6)


def test_label_smoothing_is_torchs_form() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 5, 11, generator=g)
    labels = torch.randint(11, (4, 5), generator=g)
    labels[0, 3:] = IGNORE_INDEX
    total, tokens = label_smoothed_nll(logits, labels, 0.1)
    reference = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), label_smoothing=0.1, reduction="sum")
    assert tokens == 18
    torch.testing.assert_close(total, reference)


def test_epsilon_zero_is_plain_cross_entropy() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 7, 13, generator=g)
    labels = torch.randint(13, (3, 7), generator=g)
    labels[2, 4:] = IGNORE_INDEX
    total, _ = label_smoothed_nll(logits, labels, 0.0)
    torch.testing.assert_close(total, F.cross_entropy(logits.transpose(1, 2), labels, reduction="sum"))


def test_ignored_positions_carry_no_loss_nor_gradient() -> None:
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 6, 9, generator=g, requires_grad=True)
    labels = torch.randint(9, (2, 6), generator=g)
    labels[:, ::2] = IGNORE_INDEX
    out = token_loss(logits, labels, epsilon=0.1)
    out.total.backward()
    assert out.tokens == 6
    assert logits.grad is not None
    assert bool((logits.grad[:, ::2] == 0).all()) and bool((logits.grad[:, 1::2] != 0).any())


def test_metrics_count_correct_argmax_and_unsmoothed_nll() -> None:
    logits = torch.tensor([[[0.0, 3.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 1.0]]])  # argmax 1, 0, 2
    labels = torch.tensor([[1, 2, IGNORE_INDEX]])
    out = token_loss(logits, labels, epsilon=0.1)
    assert out.metrics["correct"] == 1.0
    plain = F.cross_entropy(logits[0, :2], labels[0, :2], reduction="sum")
    assert out.metrics["nll"] == pytest.approx(plain.item())
    assert out.total.item() > plain.item()  # smoothing penalises the confident right answer


def test_epsilon_outside_unit_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="epsilon must be in"):
        label_smoothed_nll(torch.zeros(1, 3), torch.zeros(1, dtype=torch.long), 1.0)


def test_pad_batch_right_pads_and_masks() -> None:
    ids, mask = pad_batch([[5, 6, 7], [8]], value=0)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    with pytest.raises(ValueError, match="empty list of examples"):
        pad_batch([], value=0)
