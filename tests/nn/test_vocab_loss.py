"""The head's fused loss (attnkit.nn.vocab_loss) equals the readable path — logits, then
``F.cross_entropy`` — in value, metrics and every gradient, on its own and in every family."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import attnkit
from attnkit.nn.vocab_loss import IGNORE_INDEX, target_rows, vocab_cross_entropy
from attnkit.objectives.base import token_loss


def inputs(n: int = 12, d: int = 16, vocab: int = 50, bias: bool = True, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, requires_grad=True)
    w = (torch.randn(vocab, d, generator=g) * 0.3).requires_grad_()
    b = (torch.randn(vocab, generator=g) * 0.1).requires_grad_() if bias else None
    y = torch.randint(0, vocab, (n,), generator=g)
    return h, w, b, y


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("bias", [True, False])
def test_equals_cross_entropy_on_the_logits_with_its_gradients(epsilon: float, bias: bool) -> None:
    h, w, b, y = inputs(bias=bias)
    logits = F.linear(h, w, b)
    reference = F.cross_entropy(logits, y, label_smoothing=epsilon, reduction="sum")
    grads = torch.autograd.grad(reference, [t for t in (h, w, b) if t is not None])
    loss = vocab_cross_entropy(h, w, b, y, epsilon)
    assert_close(loss.total, reference)
    leaves = [t for t in (h, w, b) if t is not None]
    for got, expected in zip(torch.autograd.grad(0.25 * loss.total, leaves), grads, strict=True):
        assert_close(got, 0.25 * expected)  # the upstream gradient scales each of them
    assert loss.tokens == len(y)
    assert int(loss.correct) == int((logits.argmax(-1) == y).sum())
    assert_close(loss.nll, F.cross_entropy(logits, y, reduction="sum").detach())
    assert not loss.correct.requires_grad and not loss.nll.requires_grad


def test_a_frozen_head_gets_no_gradient_and_the_states_still_do() -> None:
    h, w, _, y = inputs(bias=False)
    w.requires_grad_(False)
    loss = vocab_cross_entropy(h, w, None, y)
    loss.total.backward()
    assert w.grad is None
    assert_close(h.grad, torch.autograd.grad(F.cross_entropy(F.linear(h, w), y, reduction="sum"), h)[0])


def test_rows_without_a_target_never_reach_the_vocabulary() -> None:
    h = torch.arange(24.0).reshape(2, 3, 4)
    targets = torch.tensor([[1, IGNORE_INDEX, 2], [IGNORE_INDEX, IGNORE_INDEX, 0]])
    rows, kept = target_rows(h, targets)
    assert_close(rows, h.reshape(6, 4)[[0, 2, 5]])
    assert kept.tolist() == [1, 2, 0]
    none = vocab_cross_entropy(rows[:0], torch.ones(3, 4, requires_grad=True), None, kept[:0])
    assert none.tokens == 0 and float(none.total.detach()) == 0.0 and int(none.correct) == 0


@pytest.mark.parametrize("bias", [True, False])
def test_a_batch_without_targets_is_a_zero_that_reaches_every_parameter(bias: bool) -> None:
    # Under DDP every parameter must get a gradient each step, even where a batch has no target.
    h, w, b, _ = inputs(bias=bias)
    loss = vocab_cross_entropy(h[:0], w, b, torch.zeros(0, dtype=torch.long))
    assert loss.tokens == 0 and int(loss.correct) == 0 and float(loss.total.detach()) == 0.0
    leaves = [t for t in (h, w, b) if t is not None]
    for leaf, grad in zip(leaves, torch.autograd.grad(loss.total, leaves), strict=True):
        assert_close(grad, torch.zeros_like(leaf))


def test_bad_smoothing_is_refused() -> None:
    h, w, b, y = inputs()
    with pytest.raises(ValueError, match="label smoothing epsilon must be in"):
        vocab_cross_entropy(h, w, b, y, epsilon=1.0)


def test_under_bf16_autocast_it_stays_with_the_readable_path() -> None:
    h, w, b, y = inputs(n=40, d=32, vocab=300)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = F.cross_entropy(F.linear(h, w, b).float(), y, reduction="sum")
        loss = vocab_cross_entropy(h, w, b, y)
    assert_close(loss.total, reference, rtol=1e-2, atol=1e-2)
    got = torch.autograd.grad(loss.total, [h, w])
    expected = torch.autograd.grad(reference, [h, w])
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == torch.float32
        assert_close(g, e, rtol=0.05, atol=0.02 * e.abs().max().item())


FAMILIES = ["transformer-tiny", "t5-tiny", "gpt-tiny", "bert-tiny", "t5-small"]


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_trains_on_the_loss_of_its_logits(name: str) -> None:
    """``model(..., target_ids=...)`` gives the loss, metrics and gradients of every parameter
    that ``token_loss`` gives on the same model's logits, without the logits."""
    torch.manual_seed(0)
    config = attnkit.preset(name)
    if name == "t5-small":  # v1.0: the tied head and its d_model^-0.5 scale
        config = config.replace(d_model=64, d_ff=128, n_layers=2, n_heads=2, d_k=32, vocab_size=300)
    model = attnkit.build_model(config).eval()
    ids = torch.randint(5, config.vocab_size, (3, 9))
    labels = torch.randint(0, config.vocab_size, (3, 9))
    labels[0, 5:] = IGNORE_INDEX
    extra = {"decoder_input_ids": ids} if config.is_encoder_decoder else {}
    for epsilon in [0.0, 0.1] if config.is_encoder_decoder else [0.0]:
        smoothing = {"label_smoothing": epsilon} if config.is_encoder_decoder else {}
        reference = token_loss(model(ids, **extra).logits, labels, epsilon)
        params = dict(model.named_parameters())
        grads = torch.autograd.grad(reference.total, list(params.values()), allow_unused=True)
        expected = dict(zip(params, grads, strict=True))
        out = model(ids, **extra, target_ids=labels, **smoothing)
        assert out.logits is None
        loss = out.vocab_loss
        assert_close(loss.total, reference.total)
        assert loss.tokens == reference.tokens and float(loss.correct) == reference.metrics["correct"]
        assert_close(float(loss.nll), reference.metrics["nll"], rtol=1e-5, atol=1e-4)
        got = dict(zip(params, torch.autograd.grad(loss.total, list(params.values()), allow_unused=True), strict=True))
        for n, g in got.items():
            if expected[n] is None:  # not reached by either (BERT's pooler)
                assert g is None, n
            else:
                assert_close(g, expected[n], rtol=1e-4, atol=2e-5, msg=lambda m, n=n: f"{name} {n}: {m}")


def test_target_ids_of_the_wrong_shape_or_vocabulary_are_refused() -> None:
    model = attnkit.build_model(attnkit.preset("gpt-tiny"))
    ids = torch.randint(5, 100, (2, 6))
    with pytest.raises(ValueError, match=r"target_ids has shape \(2, 5\), expected \(2, 6\)"):
        model(ids, target_ids=ids[:, 1:])
    with pytest.raises(ValueError, match=r"target_ids must be in \[0, \d+\) or IGNORE_INDEX \(-100\)"):
        model(ids, target_ids=torch.full_like(ids, 10**6))
