"""The position-wise feed-forward network (chapter §The Transformer Block)."""

from __future__ import annotations

from typing import Literal

import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.nn.quantized import products

Activation = Literal["relu", "gelu", "gelu_tanh", "silu"]

ACTIVATIONS = {
    "relu": F.relu,  # the chapter's max(0, ·)
    "gelu": F.gelu,  # exact erf form (BERT)
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2, T5 v1.1
    "silu": F.silu,  # swish (Marian), SwiGLU when gated
}


class FeedForward(nn.Module):
    """Implements [eq:att-ffn] FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, applied at every position.

    Variants: ``activation`` replaces max(0, ·) (GELU for BERT and GPT-2, SiLU for Marian);
    ``gated=True`` computes act(x W_1) ⊙ (x W_3) before W_2 (GEGLU with gelu/gelu_tanh as in
    T5 v1.1, SwiGLU with silu); ``bias=False`` drops b_1, b_2 (T5). ``dropout`` acts on the
    hidden activations, as in ``torch.nn.TransformerEncoderLayer`` and T5.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        activation: Activation = "relu",
        gated: bool = False,
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if d_model <= 0 or d_ff <= 0:
            raise ValueError(f"d_model ({d_model}) and d_ff ({d_ff}) must be positive")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.activation = ACTIVATIONS[activation]
        self.w_1 = nn.Linear(d_model, d_ff, bias=bias)
        self.w_3 = nn.Linear(d_model, d_ff, bias=bias) if gated else None
        self.w_2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        if self.w_3 is None:
            hidden = self.activation(self.w_1(x))  # (B, T, d_model) -> (B, T, d_ff)
        else:  # gate and up: one product of x where the layers allow (quantized.products)
            gate, up = products(x, (self.w_1, self.w_3))
            hidden = self.activation(gate) * up
        return self.w_2(self.dropout(hidden))  # (B, T, d_ff) -> (B, T, d_model)
