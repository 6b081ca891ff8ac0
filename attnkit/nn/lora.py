"""Low-rank adapters (LoRA, Hu et al. 2021) on the attention projections: fine-tuning a
pretrained model by training a rank-r correction of chosen weight matrices, everything else
frozen.

A projection W (out, in) becomes W x + (α / r) · B A x with A (r, in) and B (out, r): A starts
random, B at zero, so the adapted model starts exactly as the pretrained one; only A and B
train (r · (in + out) numbers instead of in · out). :func:`merge` folds B A back into W,
leaving a plain model of the original shape, which is what is saved.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import Tensor, nn

# The projections of attnkit.nn.attention.MultiHeadAttention an adapter may wrap.
PROJECTIONS = ("w_q", "w_k", "w_v", "w_o")


class LoRALinear(nn.Module):
    """``base`` (frozen) plus a trainable low-rank correction of its weight."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"LoRA wraps an nn.Linear, got {type(base).__name__} (load the model in fp32 to adapt it)")
        check_rank(rank)
        self.base, self.rank, self.scale = base, rank, alpha / rank
        base.requires_grad_(False)
        self.lora_a = nn.Parameter(base.weight.new_empty(rank, base.in_features))  # A (r, in)
        self.lora_b = nn.Parameter(base.weight.new_zeros(base.out_features, rank))  # B (out, r): zero, W unchanged
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))  # as nn.Linear initialises its weight
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.base(x) + (self.dropout(x) @ self.lora_a.T @ self.lora_b.T) * self.scale

    def merged(self) -> nn.Linear:
        """The plain linear map W + (α / r) B A, with ``base``'s bias."""
        out = copy.deepcopy(self.base)
        with torch.no_grad():
            out.weight += self.scale * (self.lora_b @ self.lora_a)
        out.requires_grad_(True)
        return out


def check_rank(rank: int) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"LoRA rank must be an integer >= 1, got {rank!r}; 4 to 16 is usual")


def add(
    model: nn.Module, rank: int, alpha: float | None = None, targets: tuple[str, ...] = ("w_q", "w_v"),
    dropout: float = 0.0,
) -> list[str]:  # fmt: skip
    """Freeze ``model`` and wrap the ``targets`` projections of every attention module in a
    :class:`LoRALinear` (``alpha`` defaults to ``rank``: a scale of 1); returns the wrapped
    modules' names. Only the adapters' A and B then require gradients."""
    check_rank(rank)
    unknown = [t for t in targets if t not in PROJECTIONS]
    if unknown or not targets:
        raise ValueError(f"LoRA targets must be among {', '.join(PROJECTIONS)}, got {list(targets)}")
    model.requires_grad_(False)
    wrapped = []
    for name, module in list(model.named_modules()):
        for target in targets:
            child = getattr(module, target, None)
            if isinstance(child, nn.Linear):
                setattr(module, target, LoRALinear(child, rank, float(rank if alpha is None else alpha), dropout))
                wrapped.append(f"{name}.{target}" if name else target)
    if not wrapped:
        raise ValueError(f"the model has no attention projection named {', '.join(targets)} to adapt")
    return wrapped


def has_adapters(model: nn.Module) -> bool:
    return any(isinstance(m, LoRALinear) for m in model.modules())


def merge(model: nn.Module) -> nn.Module:
    """``model`` with every adapter folded into its weight, in place: the original module tree
    and parameter names again, every parameter trainable."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, LoRALinear):
                setattr(module, name, child.merged())
    model.requires_grad_(True)
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "lora_rank", 0):  # a model built with adapters: plain now
        model.config = config.replace(lora_rank=0)
    return model


def merged_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with its adapters merged (``model`` itself when it has none)."""
    return merge(copy.deepcopy(model)) if has_adapters(model) else model  # its tokenizer and settings copied too
