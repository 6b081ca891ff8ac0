"""The head's softmax as a training loss: the vocabulary projection and the cross entropy of
[fig:att-transformer] ("Linear", then softmax) in one autograd step, over the positions that
carry a target only.

The plain way — logits of every position, ``F.cross_entropy``, an argmax for the accuracy —
walks the (positions × vocabulary) matrix about ten times a step: the product writes it, the
log-softmax reads it and writes its copy, the loss's backward fills a zero matrix and scatters
into it, the log-softmax's backward reads two and writes a third, the argmax reads it again.
At a small translator's shape that matrix (1,000 × 8,000 in fp32, 32 MB) is larger than the
caches, and those passes were 15% of a training step on the CPU (docs/translation.md).
:func:`vocab_cross_entropy` keeps one exponentiated copy for the backward and walks it four
times in all, and :meth:`VocabLoss` callers pass only the rows with a target, so padding and
the unmasked positions of masked language modelling never reach the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE_INDEX = -100  # the target of positions that carry no loss (padding, unmasked MLM tokens)


@dataclass
class VocabLoss:
    """The loss of a batch's target positions, as sums: divide by ``tokens`` (over every
    micro-batch and process) for the mean."""

    total: Tensor  # Σ (label-smoothed) cross entropy over the target positions (scalar, differentiable)
    tokens: int  # how many positions had a target
    correct: Tensor  # how many of them the argmax of the logits got right (scalar, no gradient)
    nll: Tensor  # Σ -log p(target), unsmoothed (scalar, no gradient)


def target_rows(h: Tensor, targets: Tensor, ignore_index: int = IGNORE_INDEX) -> tuple[Tensor, Tensor]:
    """The hidden states and targets of the positions that have a target.
    h (..., d), targets (...) -> (N, d), (N,)."""
    flat = targets.reshape(-1)
    where = (flat != ignore_index).nonzero().squeeze(1)  # (N,)
    return h.reshape(-1, h.shape[-1]).index_select(0, where), flat.index_select(0, where)


class _VocabCrossEntropy(torch.autograd.Function):
    """Σ_i (1-ε)(lse_i - z_{i,y_i}) + ε (lse_i - mean_v z_{i,v}), z = h Wᵀ + b, and the gradient
    softmax(z) - (1-ε) onehot(y) - ε/V, made from the exponentials kept from the forward."""

    @staticmethod
    def forward(ctx: Any, h: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, epsilon: float) -> Any:
        z = F.linear(h, weight, bias).float()  # (N, V); under autocast the product runs in its dtype
        top, predicted = z.max(dim=-1)  # (N,), (N,): the stable shift and the argmax in one pass
        e = (z - top[:, None]).exp_()  # (N, V) exp(z - max), kept for the backward
        sums = e.sum(dim=-1)  # (N,)
        lse = top + sums.log()  # (N,)
        nll = lse - z.gather(1, targets[:, None]).squeeze(1)  # (N,) -log p(y)
        total = (1.0 - epsilon) * nll.sum()
        if epsilon:
            total = total + epsilon * (lse - z.mean(dim=-1)).sum()
        ctx.compute_dtype = (
            h.dtype if not torch.is_autocast_enabled(h.device.type) else torch.get_autocast_dtype(h.device.type)
        )
        ctx.epsilon, ctx.has_bias = epsilon, bias is not None
        ctx.save_for_backward(h, weight, targets, e, sums)
        correct, nll_sum = (predicted == targets).sum(), nll.detach().sum()
        ctx.mark_non_differentiable(correct, nll_sum)
        return total, correct, nll_sum

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_total: Tensor, *_: Any) -> Any:
        h, weight, targets, e, sums = ctx.saved_tensors
        g = e.div_(sums[:, None])  # (N, V) softmax(z), in place: the kept exponentials are used once
        g.scatter_add_(1, targets[:, None], torch.full_like(targets, -(1.0 - ctx.epsilon), dtype=g.dtype)[:, None])
        if ctx.epsilon:
            g.sub_(ctx.epsilon / g.shape[1])
        dtype = ctx.compute_dtype
        g_c = g.to(dtype)
        grad_h = grad_w = grad_b = None  # each scaled by grad_total once small, not the (N, V) matrix
        if ctx.needs_input_grad[0]:
            grad_h = (g_c @ weight.to(dtype)).to(h.dtype).mul_(grad_total)  # (N, V) @ (V, d) -> (N, d)
        if ctx.needs_input_grad[1]:
            grad_w = (g_c.t() @ h.to(dtype)).to(weight.dtype).mul_(grad_total)  # (V, N) @ (N, d) -> (V, d)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g.sum(0).mul_(grad_total)  # (V,)
        return grad_h, grad_w, grad_b, None, None


def vocab_cross_entropy(
    h: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, epsilon: float = 0.0
) -> VocabLoss:
    """The label-smoothed cross entropy of logits ``h Wᵀ + b`` against ``targets``, summed, with
    the argmax's correct count and the unsmoothed NLL; the logits are never returned.

    ε = ``epsilon`` mixes the uniform distribution over the whole vocabulary into the one-hot
    target, as ``F.cross_entropy(label_smoothing=ε)`` does (tested equal, values and gradients).
    Shapes: h (N, d) — the rows that have a target (:func:`target_rows`) —, weight (V, d),
    bias (V,) or None, targets (N,) in [0, V).
    """
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"label smoothing epsilon must be in [0, 1), got {epsilon}")
    if h.shape[0] == 0:  # no target in the batch: a zero that still reaches every parameter
        zero = (h.sum() * 0.0 + weight.sum() * 0.0 + (0.0 if bias is None else bias.sum() * 0.0)).float()
        none = torch.zeros((), dtype=torch.long, device=h.device)
        return VocabLoss(zero, 0, none, zero.detach())
    total, correct, nll = _VocabCrossEntropy.apply(h, weight, bias, targets, float(epsilon))
    return VocabLoss(total, int(targets.shape[0]), correct, nll)
