"""Weight formats for inference: a trained model's linear maps held as fp32 (as trained), bf16,
or int8 with one scale per output row, behind the same ``forward`` and ``generate``.

* ``bf16``: every weight and activation in bfloat16, where the CPU computes it natively
  (AVX512-BF16 or AMX; elsewhere bf16 is emulated and slower than fp32, so it is refused).
  LayerNorm, RMSNorm and softmax accumulate their statistics in fp32 inside torch's kernels,
  and decoding takes its log-probabilities of the logits in fp32.
* ``int8``: weight-only quantisation of every linear map and of the vocabulary projection:
  ``W ≈ Q · diag(s)`` row by row, ``Q`` in [-127, 127], ``s = max|W_row| / 127``; the matrix
  product dequantises on the fly (``torch._weight_int8pack_mm``), with the activations,
  embeddings, norms and biases in bf16: the CPU kernel is fast only for bf16 inputs (measured
  here, one (1, 768) x (768, 3072) product: 59 µs with bf16 inputs, 131 µs for a bf16 matmul,
  285 µs fp32, 2.7 ms for the same kernel with fp32 inputs), so int8 needs native bf16 too. A
  weight read costs a quarter of fp32's memory traffic, which is what bounds batch-1 decoding.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.machine import native_bf16
from attnkit.models.core import LMHead, Model

WeightFormat = Literal["fp32", "bf16", "int8"]
WEIGHT_FORMATS: tuple[str, ...] = ("fp32", "bf16", "int8")


def quantize_rows(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric int8 of each output row: ``(q, scales)`` with ``weight ≈ q * scales[:, None]``,
    ``q`` int8 in [-127, 127] and ``scales`` fp32 of shape (out,). A row of zeros keeps scale 1."""
    w = weight.detach().float()
    peak = w.abs().amax(dim=1)
    scales = torch.where(peak > 0, peak / 127, torch.ones_like(peak))
    q = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scales


def int8_linear(x: Tensor, q: Tensor, scales: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ (q * scales[:, None]).T + bias`` without materialising the dequantised matrix
    where the CPU kernel exists. x: (..., in) -> (..., out)."""
    flat = x.reshape(-1, x.shape[-1])
    if flat.dtype == torch.bfloat16:
        out = torch._weight_int8pack_mm(flat.contiguous(), q, scales.to(flat.dtype))
    else:  # the kernel's fp32 path is slower than dequantising (see the module docstring)
        out = F.linear(flat, q.to(flat.dtype)) * scales.to(flat.dtype)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], q.shape[0])


class Int8Linear(nn.Module):
    """An ``nn.Linear`` of int8 rows and their fp32 scales (buffers, not parameters)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        q, scales = quantize_rows(linear.weight)
        self.register_buffer("weight_int8", q)  # (out, in)
        self.register_buffer("scales", scales)  # (out,)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: Tensor) -> Tensor:
        return int8_linear(x, self.weight_int8, self.scales, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 rows"


class Int8LMHead(LMHead):
    """The vocabulary projection in int8: its own quantised copy of the (tied) embedding, so
    the embedding lookup keeps fp32 rows while the largest matrix of a small model is read as
    int8 at every decoded token."""

    def __init__(self, head: LMHead, weight: Tensor) -> None:
        nn.Module.__init__(self)
        self.transform, self.scale, self.bias = head.transform, head.scale, head.bias
        q, scales = quantize_rows(weight)
        self.weight = None
        self.register_buffer("weight_int8", q)  # (vocab, d_model)
        self.register_buffer("scales", scales)

    def forward(self, h: Tensor, embedding: Tensor) -> Tensor:
        if self.transform is not None:
            h = self.transform(h)
        return int8_linear(h * self.scale, self.weight_int8, self.scales, self.bias)  # (B, T, vocab)


def check_format(weights: str, device: torch.device) -> None:
    """Refuse an unknown format, and bf16 where the device would emulate it."""
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights={weights!r} is not a weight format; use one of {', '.join(WEIGHT_FORMATS)}")
    if weights in ("bf16", "int8") and not native_bf16(device):
        raise ValueError(
            f"weights={weights!r} computes in bf16, which this {device.type} does not do natively (no AVX512-BF16 "
            "or AMX), so it would be slower than fp32; use weights='fp32'"
        )


def to_format(model: Model, weights: str) -> Model:
    """``model`` (in place) with its weights in ``weights`` format, for inference (eval mode)."""
    device = next(model.parameters()).device
    check_format(weights, device)
    model.eval().requires_grad_(False)
    if weights == "bf16":
        model.to(torch.bfloat16)
    elif weights == "int8":
        head_weight = model.head_weight() if model.head is not None else None
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:
                    setattr(parent, name, Int8Linear(child))
        if model.head is not None and head_weight is not None:
            model.head = Int8LMHead(model.head, head_weight)
        model.to(torch.bfloat16)  # activations, embeddings, norms, biases and scales; the rows stay int8
    model.weights = weights
    return model
