"""Normalisation layers (chapter §The Transformer Block)."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

NormKind = Literal["layer", "rms"]


class LayerNorm(nn.Module):
    """Layer normalisation over the feature dimension.

    Implements [eq:att-layernorm] γ ⊙ (x - μ)/σ + β with the biased variance
    σ² = (1/d) Σ (x_i - μ)², and ``eps`` inside the square root, σ = √(σ² + eps), as
    ``torch.nn.LayerNorm``. ``bias=False`` drops β.
    """

    def __init__(self, d_model: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        if d_model <= 0 or eps <= 0:
            raise ValueError(f"LayerNorm needs d_model > 0 and eps > 0, got {d_model}, {eps}")
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(d_model))
        self.beta = nn.Parameter(torch.zeros(d_model)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.gamma.shape, self.gamma, self.beta, self.eps)


class RMSNorm(nn.Module):
    """Root-mean-square normalisation (T5): γ ⊙ x / √(mean(x²) + eps); no centring, no β.

    The mean square is taken in float32 whatever the input dtype, as T5 does.
    """

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        if d_model <= 0 or eps <= 0:
            raise ValueError(f"RMSNorm needs d_model > 0 and eps > 0, got {d_model}, {eps}")
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(d_model))

    def forward(self, x: Tensor) -> Tensor:
        mean_square = x.float().pow(2).mean(dim=-1, keepdim=True)
        return self.gamma * (x.float() * torch.rsqrt(mean_square + self.eps)).to(x.dtype)


def make_norm(kind: NormKind, d_model: int, eps: float) -> nn.Module:
    """``"layer"`` -> :class:`LayerNorm`, ``"rms"`` -> :class:`RMSNorm`."""
    if kind == "layer":
        return LayerNorm(d_model, eps)
    if kind == "rms":
        return RMSNorm(d_model, eps)
    raise ValueError(f"norm must be 'layer' or 'rms', got {kind!r}")
