"""Weight formats for inference: a trained model's linear maps held as fp32 (as trained), bf16,
int8, 4-bit, or a GGUF file's own blocks, behind the same ``forward`` and ``generate``.

* ``bf16``: every weight and activation in bfloat16, where the CPU computes it natively
  (AVX512-BF16 or AMX; elsewhere bf16 is emulated and slower than fp32). LayerNorm, RMSNorm and
  softmax accumulate their statistics in fp32 inside torch's kernels, and decoding takes its
  log-probabilities of the logits in fp32.
* ``int8``: weight-only quantisation of every linear map and of the vocabulary projection.
  Where bf16 is native: ``W ≈ Q · diag(s)`` row by row, ``Q`` in [-127, 127], the product
  dequantising on the fly in ``torch._weight_int8pack_mm`` with the activations, embeddings,
  norms and biases in bf16 (that kernel is fast only for bf16 inputs: one (1, 768) x (768, 3072)
  product took 59 µs with bf16 inputs, 131 µs as a bf16 matmul, 285 µs fp32, 2.7 ms with fp32
  inputs). Elsewhere (an AVX2-only CPU) the weights are llama.cpp's Q8_0 blocks of 32, the
  activations stay fp32 and are quantised per block at each product, and the integer dot
  products run in attnkit's AVX2 kernel (:mod:`attnkit.kernels`).
* ``int4``: Q4_1 blocks (4-bit values with an fp16 scale and minimum per 32) through the same
  kernel, on every CPU with AVX2; the vocabulary projection stays Q8_0, as in llama.cpp's 4-bit
  files (in 4 bits SmolLM2's held-out perplexity rose 8.5% against 0.6% with its Q8_0 head).
* ``gguf``: a GGUF file's Q8_0, Q4_0 and Q4_1 tensors kept as the file's blocks
  (:func:`attnkit.interop.gguf.load_gguf`), its other tensors dequantised.

Weight reads are what bound batch-1 decoding: int8 reads about a quarter of fp32's bytes, 4-bit
blocks (20 bytes per 32 weights) a sixth. A quantised model is saved with its blocks
(:func:`layouts`, :func:`quantized_shell`) and loads bit-exact without quantising again.
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit import kernels
from attnkit.kernels import BLOCK
from attnkit.machine import native_bf16
from attnkit.models.core import LMHead, Model

log = logging.getLogger("attnkit")

WeightFormat = Literal["fp32", "bf16", "int8", "int4", "gguf"]
WEIGHT_FORMATS: tuple[str, ...] = ("fp32", "bf16", "int8", "int4", "gguf")
ROWS = "int8-rows"  # the layout of int8 where bf16 is native; the others are kernels.FORMATS
LAYOUTS = (ROWS, *kernels.FORMATS)


def _padded(features: int) -> int:
    return features + (-features % BLOCK)


def quantize_rows(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric int8 of each output row: ``(q, scales)`` with ``weight ≈ q * scales[:, None]``,
    ``q`` int8 in [-127, 127] and ``scales`` fp32 of shape (out,). A row of zeros keeps scale 1.
    ``q``'s columns are padded with zeros to a multiple of 32, as the block layouts' are."""
    w = weight.detach().float()
    peak = w.abs().amax(dim=1)
    scales = torch.where(peak > 0, peak / 127, torch.ones_like(peak))
    q = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return F.pad(q, (0, -q.shape[1] % BLOCK)), scales


class _Quantized(nn.Module):
    """A linear map of quantised weights (buffers, not parameters) and an optional fp bias."""

    layout: str

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None

    def _inputs(self, x: Tensor) -> Tensor:
        """x (..., in) -> (N, in padded to a multiple of 32)."""
        flat = x.reshape(-1, x.shape[-1])
        if flat.shape[1] != _padded(self.in_features):  # the weights are padded with zeros
            flat = F.pad(flat, (0, _padded(self.in_features) - flat.shape[1]))
        return flat

    def _finish(self, out: Tensor, x: Tensor) -> Tensor:
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def _apply(self, fn, recurse=True):  # nn.Module's signature
        """A cast of the model (``.to(torch.bfloat16)``) leaves the quantised buffers' dtypes
        as they are: they are weights and scales, not activations. Devices still move."""
        dtypes = {name: b.dtype for name, b in self._buffers.items() if b is not None}
        before = dict(self._buffers)
        super()._apply(fn, recurse)
        for name, dtype in dtypes.items():
            if self._buffers[name].dtype != dtype:
                self._buffers[name] = before[name].to(self._buffers[name].device)
        return self

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.layout}"


class Int8Linear(_Quantized):
    """int8 weights row by row (:func:`quantize_rows`) for bf16 activations, where bf16 is native."""

    layout = ROWS

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__(in_features, out_features, bias)
        self.register_buffer("weight_int8", torch.zeros(out_features, _padded(in_features), dtype=torch.int8))
        self.register_buffer("scales", torch.ones(out_features))  # (out,)

    @classmethod
    def of(cls, weight: Tensor, bias: Tensor | None = None) -> Int8Linear:
        layer = cls(weight.shape[1], weight.shape[0], bias is not None)
        layer.weight_int8, layer.scales = quantize_rows(weight)
        if bias is not None:
            layer.bias.data.copy_(bias.detach())
        return layer

    def forward(self, x: Tensor) -> Tensor:
        flat = self._inputs(x)
        if flat.dtype == torch.bfloat16:
            out = torch._weight_int8pack_mm(flat.contiguous(), self.weight_int8, self.scales.to(flat.dtype))
        else:  # fp32 activations: the kernel would be 10-20x slower than dequantising
            out = F.linear(flat, self.weight_int8.to(flat.dtype)) * self.scales.to(flat.dtype)
        return self._finish(out, x)


class BlockLinear(_Quantized):
    """Weights in llama.cpp's blocks of 32 (``layout``: q8_0, q4_0 or q4_1; :mod:`attnkit.kernels.blocks`)
    times fp32 activations through :func:`attnkit.kernels.block_matmul`."""

    def __init__(self, in_features: int, out_features: int, layout: str, bias: bool = False) -> None:
        super().__init__(in_features, out_features, bias)
        kernels.blocks.check(layout)
        self.layout = layout
        k = _padded(in_features)
        data = (out_features, k) if layout == "q8_0" else (out_features, k // 2)
        self.register_buffer("blocks", torch.zeros(data, dtype=torch.int8 if layout == "q8_0" else torch.uint8))
        self.register_buffer("block_scales", torch.zeros(out_features, k // BLOCK, dtype=torch.float16))
        mins = torch.zeros(out_features, k // BLOCK, dtype=torch.float16) if layout == "q4_1" else None
        self.register_buffer("block_mins", mins)

    @classmethod
    def of(cls, weight: Tensor, layout: str, bias: Tensor | None = None) -> BlockLinear:
        """``weight`` (out, in) quantised to ``layout``'s blocks (in padded with zeros)."""
        data, d, m = kernels.quantize(F.pad(weight.detach().float(), (0, -weight.shape[1] % BLOCK)), layout)
        return cls.of_blocks(weight.shape[1], layout, data, d, m, bias)

    @classmethod
    def of_blocks(
        cls, in_features: int, layout: str, data: Tensor, d: Tensor, m: Tensor | None, bias: Tensor | None = None
    ) -> BlockLinear:
        """A layer holding these blocks as they are (a GGUF file's)."""
        layer = cls(in_features, data.shape[0], layout, bias is not None)
        for name, value in (("blocks", data), ("block_scales", d), ("block_mins", m)):
            if value is not None:
                expected = layer._buffers[name]
                if value.shape != expected.shape or value.dtype != expected.dtype:
                    raise ValueError(
                        f"{layout} {name} of shape {tuple(value.shape)} {value.dtype} for a ({data.shape[0]}, "
                        f"{in_features}) weight; expected {tuple(expected.shape)} {expected.dtype}"
                    )
                layer._buffers[name] = value.contiguous()
        if bias is not None:
            layer.bias.data.copy_(bias.detach())
        return layer

    def forward(self, x: Tensor) -> Tensor:
        flat = self._inputs(x).float()
        out = kernels.block_matmul(flat, self.layout, self.blocks, self.block_scales, self.block_mins)
        return self._finish(out.to(x.dtype), x)


def _shell(layout: str, in_features: int, out_features: int, bias: bool) -> _Quantized:
    if layout == ROWS:
        return Int8Linear(in_features, out_features, bias)
    return BlockLinear(in_features, out_features, layout, bias)


class QuantizedLMHead(LMHead):
    """The vocabulary projection through its own quantised copy of the (tied) embedding, so the
    embedding lookup keeps fp rows while the largest matrix of a small model is read quantised
    at every decoded token."""

    def __init__(self, head: LMHead, proj: _Quantized) -> None:
        nn.Module.__init__(self)
        self.transform, self.scale, self.bias = head.transform, head.scale, head.bias
        self.weight = None
        self.proj = proj  # (vocab, d_model), no bias of its own

    def forward(self, h: Tensor, embedding: Tensor) -> Tensor:
        if self.transform is not None:
            h = self.transform(h)
        logits = self.proj(h * self.scale)  # (B, T, vocab)
        return logits if self.bias is None else logits + self.bias


def _quantized(layout: str, weight: Tensor, bias: Tensor | None = None) -> _Quantized:
    return Int8Linear.of(weight, bias) if layout == ROWS else BlockLinear.of(weight, layout, bias)


def layouts(model: Model) -> dict[str, str]:
    """Each quantised layer's name and layout (``"head"`` for the vocabulary projection)."""
    found = {}
    for name, module in model.named_modules():
        if isinstance(module, _Quantized):
            found["head" if name == "head.proj" else name] = module.layout
    return found


def quantized_buffers(model: Model) -> dict[str, Tensor]:
    """The quantised layers' buffers, by their names in the model's state dict."""
    return {
        f"{name}.{key}": value
        for name, module in model.named_modules()
        if isinstance(module, _Quantized)
        for key, value in module._buffers.items()
        if value is not None
    }


def quantized_shell(model: Model, found: dict[str, str]) -> Model:
    """``model`` with the layers named in ``found`` (:func:`layouts` of a saved model) replaced by
    quantised layers of zeros of the same shapes, ready for a saved model's tensors."""
    for name, layout in found.items():
        if layout not in LAYOUTS:
            raise ValueError(f"layer {name!r} has layout {layout!r}; attnkit reads {', '.join(LAYOUTS)}")
        if name == "head":
            vocab, d_model = model.head_weight().shape
            model.head = QuantizedLMHead(model.head, _shell(layout, d_model, vocab, False))
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        linear = getattr(parent, child, None)
        if type(linear) is not nn.Linear:
            raise ValueError(f"layer {name!r} is not a linear map of this model, so it cannot hold {layout} weights")
        setattr(parent, child, _shell(layout, linear.in_features, linear.out_features, linear.bias is not None))
    return model


def saved_layers(section: object, source: object) -> tuple[str, dict[str, str]]:
    """The format and layer layouts of a saved config.json's ``weights`` section (None: fp32)."""
    if section is None:
        return "fp32", {}
    if (
        not isinstance(section, dict)
        or section.get("format") not in ("int8", "int4", "gguf")
        or not isinstance(section.get("layers"), dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in section["layers"].items())
    ):
        raise ValueError(
            f'{source}: \'weights\' must be {{"format": int8, int4 or gguf, "layers": {{name: layout}}}}, '
            f"not {section!r}; the file was not written by save_pretrained"
        )
    return section["format"], section["layers"]


def finish_format(model: Model, weights: str) -> Model:
    """Inference mode for a model whose layers are in ``weights`` format; with int8 rows, its
    activations, embeddings, norms, biases and scales in bf16 (the rows stay int8)."""
    model.eval().requires_grad_(False)
    if weights == "bf16" or ROWS in layouts(model).values():
        model.to(torch.bfloat16)
    model.weights = weights
    return model


def runs_fast(weights: str, device: torch.device) -> bool:
    """Whether ``device`` runs ``weights`` faster than emulation: bf16 where it is native, int8
    there or through attnkit's AVX2 kernel, int4 and GGUF blocks through that kernel."""
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights={weights!r} is not a weight format; use one of {', '.join(WEIGHT_FORMATS)}")
    blocks = device.type == "cpu" and kernels.available()
    return {"fp32": True, "bf16": native_bf16(device), "int8": native_bf16(device) or blocks}.get(weights, blocks)


def format_for(weights: str, device: torch.device) -> str:
    """The format ``weights`` is served as on ``device``: itself, or where this machine cannot run
    it faster than fp32, the fastest that it can, with a line in the log saying so. An unknown
    format is a ``ValueError``."""
    if runs_fast(weights, device):
        return weights
    instead = next(f for f in ("int8", "fp32") if runs_fast(f, device))
    need = (
        "native bf16 (AVX512-BF16 or AMX)" if weights == "bf16" else "attnkit's AVX2 kernel (see the log for why not)"
    )
    log.warning("weights=%r needs %s, which this %s lacks; using %r", weights, need, device.type, instead)
    return instead


def to_format(model: Model, weights: str) -> Model:
    """``model`` (in place) with its weights in ``weights`` format, for inference (eval mode);
    the format this machine runs instead where it cannot run ``weights`` fast (:func:`format_for`).
    ``"gguf"`` leaves the layers as they are: the blocks :func:`attnkit.interop.gguf.load_gguf`
    kept, and fp32 where the file had no blocks."""
    device = next(model.parameters()).device
    weights = format_for(weights, device)
    if weights in ("int8", "int4"):
        layout = "q4_1" if weights == "int4" else ROWS if native_bf16(device) else "q8_0"
        quantizable = model.head is not None and not isinstance(model.head, QuantizedLMHead)
        head_weight = model.head_weight() if quantizable else None
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:
                    setattr(parent, name, _quantized(layout, child.weight, child.bias))
        if head_weight is not None:  # int4 keeps the vocabulary projection in Q8_0, as llama.cpp's 4-bit files do
            model.head = QuantizedLMHead(model.head, _quantized("q8_0" if weights == "int4" else layout, head_weight))
    return finish_format(model, weights)
