"""Linear maps of quantised weights for inference (:mod:`attnkit.models.weights` chooses and
builds them): int8 rows for bf16 activations (:class:`Int8Linear`) and llama.cpp's blocks of 32
(:class:`BlockLinear`, :mod:`attnkit.kernels`). Their weights are buffers, kept in their own
dtypes whatever the model is cast to."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit import kernels
from attnkit.kernels import BLOCK, gemm

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


class Quantized(nn.Module):
    """A linear map of quantised weights (buffers, not parameters) and an optional fp bias."""

    layout: str

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None

    def _inputs(self, x: Tensor) -> Tensor:
        """x (..., in) -> (N, in padded to a multiple of 32)."""
        flat = x.reshape(x.shape[:-1].numel(), x.shape[-1])  # sizes given: in may be 0
        if flat.shape[1] != _padded(self.in_features):  # the weights are padded with zeros
            flat = F.pad(flat, (0, _padded(self.in_features) - flat.shape[1]))
        return flat

    def _with_bias(self, bias: Tensor | None) -> Quantized:
        if bias is not None:
            self.bias.data.copy_(bias.detach())
        return self

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


class Int8Linear(Quantized):
    """int8 weights row by row (:func:`quantize_rows`) for bf16 activations, where bf16 is native."""

    layout = ROWS

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__(in_features, out_features, bias)
        self.register_buffer("weight_int8", torch.zeros(out_features, _padded(in_features), dtype=torch.int8))
        # (out,) in the bf16 of the activations they meet, so that no product casts them
        self.register_buffer("scales", torch.ones(out_features, dtype=torch.bfloat16))

    @classmethod
    def of(cls, weight: Tensor, bias: Tensor | None = None) -> Int8Linear:
        layer = cls(weight.shape[1], weight.shape[0], bias is not None)
        layer.weight_int8, scales = quantize_rows(weight)
        layer.scales = scales.to(torch.bfloat16)
        return layer._with_bias(bias)

    def forward(self, x: Tensor) -> Tensor:
        flat = self._inputs(x)
        if flat.dtype == torch.bfloat16:
            out = torch._weight_int8pack_mm(flat.contiguous(), self.weight_int8, self.scales)
        else:  # fp32 activations: the kernel would be 10-20x slower than dequantising
            out = F.linear(flat, self.weight_int8.to(flat.dtype)) * self.scales.to(flat.dtype)
        return self._finish(out, x)


class BlockLinear(Quantized):
    """Weights in llama.cpp's blocks of 32 (``layout``: q8_0, q4_0 or q4_1; :mod:`attnkit.kernels.blocks`)
    times fp32 activations through :func:`attnkit.kernels.block_matmuls` (:func:`products` of one layer).

    Where the C kernel runs (on the CPU), the layer holds its blocks split as that kernel reads
    them fastest (:func:`attnkit.kernels.split`, 2-3x faster per product at batch 1): ``packed``
    (a buffer that is not saved) its groups of 8 rows, and ``blocks``, ``block_scales``,
    ``block_mins`` only the rows after them; the weights are held once. Its state dict, what is
    saved, holds all the blocks (:meth:`whole`); a load into the layer, or a move to another
    device, unsplits them first (:meth:`unsplit`), and they are split again when they changed
    (:meth:`refresh`)."""

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
        self.register_buffer("packed", None, persistent=False)
        self._packed_from: tuple[int, ...] | None = None  # the blocks' versions when they were split
        # Times the blocks were split: a stack of this layer's weights held by another layer
        # (:meth:`many_rows`) keys on it (the versions start again from the split's new tensors).
        self._splits = 0
        self._gemm: tuple[tuple, torch.ScriptObject] | None = None  # ((engine, extra bias), weights): many rows

    @classmethod
    def of(cls, weight: Tensor, layout: str, bias: Tensor | None = None) -> BlockLinear:
        """``weight`` (out, in) quantised to ``layout``'s blocks (in padded with zeros)."""
        layer = cls(weight.shape[1], weight.shape[0], layout, bias is not None)
        padded = F.pad(weight.detach().float(), (0, -weight.shape[1] % BLOCK))
        layer.blocks, layer.block_scales, layer.block_mins = kernels.quantize(padded, layout)
        layer.repack()
        return layer._with_bias(bias)

    _NAMES = ("blocks", "block_scales", "block_mins")

    def _versions(self) -> tuple[int, ...]:
        return tuple(t._version for t in (self.blocks, self.block_scales, self.block_mins, self.bias) if t is not None)

    def whole(self) -> tuple[Tensor, Tensor, Tensor | None]:
        """All the blocks ``(data, d, m)``: the buffers, or new tensors where they are split."""
        return kernels.whole(self.layout, (self.blocks, self.block_scales, self.block_mins, self.packed), self._k)

    @property
    def _k(self) -> int:
        return _padded(self.in_features)

    def unsplit(self) -> None:
        """Hold all the blocks as blocks again, none packed (split again at the next product); the
        many-row GEMM's weights are dropped too (made again at its next product)."""
        self._gemm = None
        if self.packed is not None:
            self.blocks, self.block_scales, self.block_mins = self.whole()
            self.packed, self._packed_from = None, None

    def repack(self) -> None:
        """Split the blocks for the C kernel where it runs (on the CPU), else hold them whole."""
        self.unsplit()
        if self.blocks.device.type == "cpu" and kernels.available():
            self.blocks, self.block_scales, self.block_mins, self.packed = kernels.split(
                self.layout, self.blocks, self.block_scales, self.block_mins
            )
        self._packed_from = self._versions()
        self._splits += 1

    def refresh(self) -> None:
        """:meth:`repack` if the blocks changed in place since they were split (a load)."""
        if self._packed_from != self._versions():
            self.repack()

    def weights(self) -> kernels.Weight:
        """The blocks as :func:`attnkit.kernels.block_matmuls` takes them, split where they can be
        (:meth:`refresh`-ed first; under ``torch.compile`` as they are)."""
        if not torch.compiler.is_compiling():
            self.refresh()
        return self.blocks, self.block_scales, self.block_mins, self.packed

    def many_rows(
        self, x: Tensor, engine: str, bias: Tensor | None = None, others: Sequence[BlockLinear] = ()
    ) -> Tensor:
        """``x`` (m, k padded) fp32 of :data:`gemm.MANY_ROWS` rows or more times the weights of this
        layer and of ``others`` (layers of the same input, their rows stacked after this one's:
        attention's w_q, w_k, w_v in one product, the activations quantised once) through the int8
        GEMM of ``engine`` (:mod:`attnkit.kernels.gemm`), plus the layers' biases and ``bias`` (a
        vocabulary projection's, in the GEMM's own pass): (m, out + Σ others' out). Their int8
        weights per output row are made from the blocks at the first such product (held beside
        this layer's blocks, as many bytes again as the layers' Q8_0) and again after any of the
        blocks or a bias change."""
        layers = (self, *others)
        for layer in layers:
            layer.refresh()
        key = engine, None if bias is None else (id(bias), bias._version), tuple((id(o), o._splits) for o in others)
        if self._gemm is None or self._gemm[0] != key:
            q, scales = quantize_rows(torch.cat([kernels.dequantize(layer.layout, *layer.whole()) for layer in layers]))
            added = None
            if bias is not None or any(layer.bias is not None for layer in layers):
                added = torch.cat([torch.zeros(layer.out_features) if layer.bias is None else layer.bias.float()
                                   for layer in layers])  # fmt: skip
                added = added if bias is None else added + bias.float()
            self._gemm = key, gemm.pack(q, scales, added, engine)
        return gemm.matmul(x, self._gemm[1], engine)

    def _save_to_state_dict(self, destination, prefix, keep_vars):  # nn.Module's signature
        """All the blocks, as an unsplit layer holds them."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.packed is not None:
            for name, tensor in zip(self._NAMES, self.whole(), strict=True):
                if tensor is not None:
                    destination[prefix + name] = tensor

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # nn.Module's signature
        """Into all the blocks (unsplit first; split again at the next product)."""
        self.unsplit()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _apply(self, fn, recurse=True):  # nn.Module's signature
        """A move or a cast takes all the blocks (unsplit), split again on the CPU."""
        split = self.packed is not None
        self.unsplit()
        super()._apply(fn, recurse)
        if split:
            self.repack()
        return self

    def forward(self, x: Tensor) -> Tensor:
        return products(x, (self,))[0]


def products(x: Tensor, layers: Sequence[nn.Module], bias: Tensor | None = None) -> list[Tensor]:
    """Each of ``layers`` applied to one input ``x`` (attention's w_q, w_k, w_v; a gated FFN's w_1,
    w_3); ``bias``, with one layer only, added to its output (a vocabulary projection's). Where all
    are :class:`BlockLinear` of one layout: from :data:`gemm.MANY_ROWS` rows of ``x`` on, all
    through one int8 GEMM (:meth:`BlockLinear.many_rows`) where ``x`` is narrow enough for its one
    scale (:func:`gemm.suits`; eager only: ``torch.compile`` cannot trace its packed weights);
    else one kernel call computes them all (:func:`attnkit.kernels.block_matmuls`): at batch 1 a
    product of a small matrix costs more in its call than in its arithmetic. Any other layers are called one by one."""
    if bias is not None and len(layers) != 1:
        raise ValueError(f"a bias is added to one layer's output, not to {len(layers)} layers'")
    first = layers[0]
    if not all(type(layer) is BlockLinear and layer.layout == first.layout for layer in layers):
        return [layer(x) if bias is None else layer(x) + bias for layer in layers]
    flat = first._inputs(x).float()
    many = len(flat) >= gemm.MANY_ROWS and flat.device.type == "cpu" and not torch.compiler.is_compiling()
    engine = gemm.engine() if many else None
    sizes = [layer.out_features for layer in layers]
    if engine is not None and gemm.suits(flat):  # one GEMM for all, their biases added in it
        out = first.many_rows(flat, engine, bias, layers[1:]).to(x.dtype)  # (N, Σ n_i)
        return [part.reshape(*x.shape[:-1], -1) for part in out.split(sizes, dim=-1)]
    weights = [layer.weights() for layer in layers]
    out = kernels.block_matmuls(flat, first.layout, weights).to(x.dtype)
    parts = out.split(sizes, dim=-1)  # (N, Σ n_i) -> (N, n_i) each
    outs = [layer._finish(part, x) for layer, part in zip(layers, parts, strict=True)]
    return outs if bias is None else [outs[0] + bias]


def repack_changed(model: nn.Module) -> None:
    """Pack again each :class:`BlockLinear` of ``model`` whose blocks changed since it was packed
    (after a load copies them in): done at the load, not by the first forward after it, so that
    the model's tensors stay those it was loaded with."""
    for module in model.modules():
        if isinstance(module, BlockLinear):
            module.refresh()


def quantized_state(model: nn.Module) -> dict[str, Tensor]:
    """The quantised layers' state, by their names in the model's state dict, leaving the layers as
    they are: what :func:`quantized_buffers` names, all the blocks (a split layer's put together)."""
    return {
        key: value
        for name, module in model.named_modules()
        if isinstance(module, Quantized)
        for key, value in module.state_dict(prefix=f"{name}.").items()
        if key.rsplit(".", 1)[-1] in module._buffers
    }


def shell(layout: str, in_features: int, out_features: int, bias: bool) -> Quantized:
    if layout == ROWS:
        return Int8Linear(in_features, out_features, bias)
    return BlockLinear(in_features, out_features, layout, bias)


def quantized(layout: str, weight: Tensor, bias: Tensor | None = None) -> Quantized:
    return Int8Linear.of(weight, bias) if layout == ROWS else BlockLinear.of(weight, layout, bias)


HEAD = "head.proj"  # the vocabulary projection's layer, named "head" in :func:`layouts`


def layouts(model: nn.Module) -> dict[str, str]:
    """Each quantised layer's name and layout (``"head"`` for the vocabulary projection)."""
    found = {}
    for name, module in model.named_modules():
        if isinstance(module, Quantized):
            found["head" if name == HEAD else name] = module.layout
    return found


def block_tensors(name: str, data: Tensor, d: Tensor, m: Tensor | None) -> dict[str, Tensor]:
    """The state-dict entries of the :class:`BlockLinear` named ``name`` (as in :func:`layouts`)
    that holds these blocks (:mod:`attnkit.kernels.blocks`)."""
    prefix = HEAD if name == "head" else name
    found = {f"{prefix}.blocks": data, f"{prefix}.block_scales": d}
    return found if m is None else found | {f"{prefix}.block_mins": m}


def quantized_buffers(model: nn.Module) -> dict[str, Tensor]:
    """The quantised layers' buffers, by their names in the model's state dict, to load into: all
    the blocks (a layer of split blocks is unsplit first, and split again at its next product), not
    the packed groups, which are not saved. To save, :func:`quantized_state`."""
    found = {}
    for name, module in model.named_modules():
        if isinstance(module, BlockLinear):
            module.unsplit()
        if isinstance(module, Quantized):
            for key, value in module._buffers.items():
                if value is not None and key not in module._non_persistent_buffers_set:
                    found[f"{name}.{key}"] = value
    return found
