"""Weight formats for inference: a trained model's linear maps held as fp32 (as trained), bf16,
int8, 4-bit, or a GGUF file's own blocks, behind the same ``forward`` and ``generate``.

* ``bf16``: every weight and activation in bfloat16, where the CPU computes it natively
  (AVX512-BF16 or AMX; elsewhere bf16 is emulated and slower than fp32). Norms and softmax
  accumulate in fp32 inside torch's kernels; decoding takes its log-probabilities in fp32.
* ``int8``: every linear map and the vocabulary projection in llama.cpp's Q8_0 blocks of 32,
  the activations quantised per block to int16 at each product, the integer dot products in
  attnkit's C kernel (:mod:`attnkit.kernels`: AVX2 on x86-64, NEON on ARM64): the same numbers on
  every CPU class. Where that kernel cannot run but bf16 is native, rows instead:
  ``W ≈ Q · diag(s)``, ``Q`` in [-127, 127], through ``torch._weight_int8pack_mm`` with bf16
  activations (that kernel is fast only for bf16 inputs).
* ``int4``: Q4_1 blocks (4-bit values, an fp16 scale and minimum per 32, chosen per block by
  least squares: :func:`attnkit.kernels.blocks.quantize`) through the same kernel; the vocabulary
  projection stays Q8_0, as in llama.cpp's 4-bit files (a 4-bit head costs far more perplexity).
* ``gguf``: a GGUF file's Q8_0, Q4_0 and Q4_1 tensors kept as the file's blocks, Q4_K as Q4_1
  blocks with the file's values, other quantised types requantised to Q8_0
  (:func:`attnkit.interop.gguf.load_gguf`), its float tensors as they are.

Weight reads are what bound batch-1 decoding: int8 reads about a quarter of fp32's bytes, 4-bit
blocks (20 bytes per 32 weights) a sixth. A quantised model is saved with its blocks
(:func:`attnkit.nn.quantized.layouts`, :func:`quantized_shell`) and loads bit-exact without
quantising again. What each format costs and gains, measured: docs/decoding.md.
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
from torch import Tensor, nn

from attnkit import kernels
from attnkit.machine import native_bf16
from attnkit.models.core import LMHead, Model
from attnkit.nn import lora
from attnkit.nn.quantized import LAYOUTS, ROWS, Quantized, layouts, products, quantized, shell

log = logging.getLogger("attnkit")

WeightFormat = Literal["fp32", "bf16", "int8", "int4", "gguf"]
WEIGHT_FORMATS: tuple[str, ...] = ("fp32", "bf16", "int8", "int4", "gguf")


class QuantizedLMHead(LMHead):
    """The vocabulary projection through its own quantised copy of the (tied) embedding, so the
    embedding lookup keeps fp rows while the largest matrix of a small model is read quantised
    at every decoded token."""

    def __init__(self, head: LMHead, proj: Quantized) -> None:
        nn.Module.__init__(self)
        self.transform, self.scale, self.bias = head.transform, head.scale, head.bias
        self.weight = None
        self.proj = proj  # (vocab, d_model), no bias of its own

    def forward(self, h: Tensor, embedding: Tensor) -> Tensor:
        if self.transform is not None:
            h = self.transform(h)
        return products(h * self.scale, (self.proj,), self.bias)[0]  # (B, T, vocab)


def quantized_shell(model: Model, found: dict[str, str]) -> Model:
    """``model`` with the layers named in ``found`` (:func:`layouts` of a saved model) replaced by
    quantised layers of zeros of the same shapes, ready for a saved model's tensors."""
    for name, layout in found.items():
        if layout not in LAYOUTS:
            raise ValueError(f"layer {name!r} has layout {layout!r}; attnkit reads {', '.join(LAYOUTS)}")
        if name == "head":
            vocab, d_model = model.head_weight().shape
            model.head = QuantizedLMHead(model.head, shell(layout, d_model, vocab, False))
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        linear = getattr(parent, child, None)
        if type(linear) is not nn.Linear:
            raise ValueError(f"layer {name!r} is not a linear map of this model, so it cannot hold {layout} weights")
        setattr(parent, child, shell(layout, linear.in_features, linear.out_features, linear.bias is not None))
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


def check_format(weights: str, *also: str) -> None:
    """Refuse ``weights`` unless it is a weight format (or one of ``also``: the loader's
    ``"auto"``), with the list to choose from."""
    known = (*also, *WEIGHT_FORMATS)
    if weights not in known:
        raise ValueError(f"weights={weights!r} is not a weight format; use one of {', '.join(known)}")


def runs_fast(weights: str, device: torch.device) -> bool:
    """Whether ``device`` runs ``weights`` faster than emulation: bf16 where it is native, int8
    there or through attnkit's C kernel (AVX2 or NEON), int4 and GGUF blocks through that kernel."""
    check_format(weights)
    blocks = device.type == "cpu" and kernels.available()
    return {"fp32": True, "bf16": native_bf16(device), "int8": native_bf16(device) or blocks}.get(weights, blocks)


def format_for(weights: str, device: torch.device) -> str:
    """The format ``weights`` is served as on ``device``: itself, or where this machine cannot run
    it faster than fp32, the fastest that it can, with a line in the log saying so. An unknown
    format is a ``ValueError``."""
    if runs_fast(weights, device):
        return weights
    instead = next(f for f in ("int8", "fp32") if runs_fast(f, device))
    need = "native bf16 (AVX512-BF16 or AMX)" if weights == "bf16" else "attnkit's C kernel (see the log for why not)"
    log.warning("weights=%r needs %s, which this %s lacks; using %r", weights, need, device.type, instead)
    return instead


def to_format(model: Model, weights: str) -> Model:
    """``model`` (in place) with its weights in ``weights`` format, for inference (eval mode);
    the format this machine runs instead where it cannot run ``weights`` fast (:func:`format_for`)."""
    return apply_format(model, format_for(weights, next(model.parameters()).device))


def apply_format(model: Model, weights: str) -> Model:
    """``model`` (in place) with its weights in ``weights`` format, one that :func:`format_for`
    has decided this machine runs, for inference (eval mode). ``"gguf"`` leaves the layers as
    they are: the blocks :func:`attnkit.interop.gguf.load_gguf` kept, and fp32 where the file
    had no blocks. LoRA adapters are folded into their weights first (a run directory's model
    keeps them): the formats are for inference, and a quantised weight cannot take their update."""
    if lora.has_adapters(model):
        lora.merge(model)
    device = next(model.parameters()).device
    if weights in ("int8", "int4"):
        blocks = device.type == "cpu" and kernels.available()
        layout = "q4_1" if weights == "int4" else "q8_0" if blocks else ROWS
        quantizable = model.head is not None and not isinstance(model.head, QuantizedLMHead)
        head_weight = model.head_weight() if quantizable else None
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:
                    setattr(parent, name, quantized(layout, child.weight, child.bias))
        if head_weight is not None:  # int4 keeps the vocabulary projection in Q8_0, as llama.cpp's 4-bit files do
            model.head = QuantizedLMHead(model.head, quantized("q8_0" if weights == "int4" else layout, head_weight))
    return finish_format(model, weights)
