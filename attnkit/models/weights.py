"""Weight formats for inference: a trained model's linear maps held as fp32 (as trained), bf16,
or int8, behind the same ``forward`` and ``generate``.

* ``bf16``: every weight and activation in bfloat16, where the CPU computes it natively
  (AVX512-BF16 or AMX; elsewhere bf16 is emulated and slower than fp32, so it is refused).
  LayerNorm, RMSNorm and softmax accumulate their statistics in fp32 inside torch's kernels,
  and decoding takes its log-probabilities of the logits in fp32.
* ``int8``: weight-only quantisation of every linear map and of the vocabulary projection:
  ``W ≈ Q · diag(s)`` row by row, ``Q`` in [-127, 127], ``s = max|W_row| / 127``; the matrix
  product dequantises on the fly (``torch._weight_int8pack_mm``), with the activations,
  embeddings, norms and biases in bf16: the CPU kernel is fast only for bf16 inputs (measured
  here, one (1, 768) x (768, 3072) product: 59 µs with bf16 inputs, 131 µs for a bf16 matmul,
  285 µs fp32, 2.7 ms for the same kernel with fp32 inputs). Where bf16 is not native (an
  AVX2-only CPU) the weights are int8 in blocks of 32 inputs with a scale each (llama.cpp's
  Q8_0), the activations stay fp32 and are quantised the same way at each product, and the
  integer dot products run in attnkit's AVX2 kernel (:mod:`attnkit.kernels`).
  A weight read costs a quarter of fp32's memory traffic, which is what bounds batch-1 decoding.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit import kernels
from attnkit.machine import native_bf16
from attnkit.models.core import LMHead, Model

WeightFormat = Literal["fp32", "bf16", "int8"]
WEIGHT_FORMATS: tuple[str, ...] = ("fp32", "bf16", "int8")


def quantize_rows(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric int8 of each output row: ``(q, scales)`` with ``weight ≈ q * scales[:, None]``,
    ``q`` int8 in [-127, 127] and ``scales`` fp32 of shape (out,). A row of zeros keeps scale 1.
    ``q``'s columns are padded with zeros to a multiple of 32 (the fp32 kernel's blocks)."""
    w = weight.detach().float()
    peak = w.abs().amax(dim=1)
    scales = torch.where(peak > 0, peak / 127, torch.ones_like(peak))
    q = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return F.pad(q, (0, -q.shape[1] % kernels.BLOCK)), scales


def quantize(weight: Tensor, blocks: bool) -> tuple[Tensor, Tensor]:
    """``weight`` (out, in) as int8 (out, in padded to a multiple of 32) and its scales: one per
    row (:func:`quantize_rows`), or with ``blocks`` one per block of 32 inputs (out, in / 32)."""
    if not blocks:
        return quantize_rows(weight)
    return kernels.quantize_blocks(F.pad(weight.detach().float(), (0, -weight.shape[1] % kernels.BLOCK)))


def int8_linear(x: Tensor, q: Tensor, scales: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x`` times the int8 weights ``q`` (out, in padded) and their ``scales``, plus ``bias``,
    without materialising the dequantised matrix: with block scales (out, in / 32), ``x``
    quantised per block through :func:`attnkit.kernels.int8_matmul`; with row scales (out,),
    bf16 ``x`` through ``torch._weight_int8pack_mm`` (fp32 ``x``: dequantised). x: (..., in)
    -> (..., out)."""
    flat = x.reshape(-1, x.shape[-1])
    if q.shape[1] != flat.shape[1]:  # inputs not a multiple of 32: the weights are padded with zeros
        flat = F.pad(flat, (0, q.shape[1] - flat.shape[1]))
    if scales.dim() == 2:
        out = kernels.int8_matmul(flat.float(), q, scales).to(flat.dtype)
    elif flat.dtype == torch.bfloat16:
        out = torch._weight_int8pack_mm(flat.contiguous(), q, scales.to(flat.dtype))
    else:
        out = F.linear(flat, q.to(flat.dtype)) * scales.to(flat.dtype)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], q.shape[0])


class Int8Linear(nn.Module):
    """An ``nn.Linear`` of int8 weights and their fp32 scales (buffers, not parameters), per
    row or, with ``blocks``, per block of 32 inputs (:func:`quantize`)."""

    def __init__(self, linear: nn.Linear, blocks: bool = False) -> None:
        super().__init__()
        q, scales = quantize(linear.weight, blocks)
        self.register_buffer("weight_int8", q)  # (out, in)
        self.register_buffer("scales", scales)  # (out,)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: Tensor) -> Tensor:
        return int8_linear(x, self.weight_int8, self.scales, self.bias)

    def extra_repr(self) -> str:
        layout = "blocks of 32" if self.scales.dim() == 2 else "rows"
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 {layout}"


class Int8LMHead(LMHead):
    """The vocabulary projection in int8: its own quantised copy of the (tied) embedding, so
    the embedding lookup keeps fp32 rows while the largest matrix of a small model is read as
    int8 at every decoded token."""

    def __init__(self, head: LMHead, weight: Tensor, blocks: bool = False) -> None:
        nn.Module.__init__(self)
        self.transform, self.scale, self.bias = head.transform, head.scale, head.bias
        q, scales = quantize(weight, blocks)
        self.weight = None
        self.register_buffer("weight_int8", q)  # (vocab, d_model)
        self.register_buffer("scales", scales)

    def forward(self, h: Tensor, embedding: Tensor) -> Tensor:
        if self.transform is not None:
            h = self.transform(h)
        return int8_linear(h * self.scale, self.weight_int8, self.scales, self.bias)  # (B, T, vocab)


def check_format(weights: str, device: torch.device) -> None:
    """Refuse an unknown format, bf16 where the device would emulate it, and int8 where neither
    bf16 nor the AVX2 kernel runs (it would be slower than fp32)."""
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights={weights!r} is not a weight format; use one of {', '.join(WEIGHT_FORMATS)}")
    if weights == "bf16" and not native_bf16(device):
        raise ValueError(
            f"weights='bf16' computes in bf16, which this {device.type} does not do natively (no AVX512-BF16 "
            "or AMX), so it would be slower than fp32; use weights='int8' (AVX2) or 'fp32'"
        )
    if weights == "int8" and not native_bf16(device) and not (device.type == "cpu" and kernels.available()):
        raise ValueError(
            f"weights='int8' needs native bf16 or attnkit's AVX2 kernel, and this {device.type} has neither "
            "(see the log for why), so it would be slower than fp32; use weights='fp32'"
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
        blocks = not native_bf16(device)  # fp32 activations: the AVX2 kernel's blocks
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:
                    setattr(parent, name, Int8Linear(child, blocks))
        if model.head is not None and head_weight is not None:
            model.head = Int8LMHead(model.head, head_weight, blocks)
        if not blocks:  # activations, embeddings, norms, biases and scales; the rows stay int8
            model.to(torch.bfloat16)
    model.weights = weights
    return model
