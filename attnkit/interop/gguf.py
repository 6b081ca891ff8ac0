"""GGUF files (llama.cpp's format) in: a Llama checkpoint, its quantised blocks dequantised or kept
as blocks attnkit computes on, and its byte-level BPE tokenizer, read with the ``gguf`` package
into attnkit's own model.

Kept as blocks (``keep_blocks``, ``weights="gguf"``): Q8_0, Q4_0 and Q4_1 as the file holds them;
Q4_K as Q4_1, its 4-bit values as they are (each superblock of 256 is eight blocks of 32 with a
6-bit scale and minimum times the superblock's fp16 ones: their products, rounded to fp16, are
the blocks' scale and minimum); every other quantised type the ``gguf`` package reads (Q5_0,
Q5_1, Q2_K, Q3_K, Q5_K, Q6_K, the IQ types) requantised to Q8_0 from its values, finer than any
of them (within half an int8 step of each block's largest value). Float tensors stay float.

The only place that knows GGUF's tensor and metadata names. llama.cpp stores the query and
key projections permuted for its interleaved rotary layout; they are permuted back to
Llama's halves layout, so the model is the one ``transformers`` loads from the same file.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import Tensor

from attnkit.config import ModelConfig, preset
from attnkit.models import build_loaded
from attnkit.models.core import Model

# GGUF tensor name (with {i} for the layer) -> attnkit name.
_NAMES = {
    "token_embd.weight": "embeddings.token.weight",
    "output_norm.weight": "decoder.final_norm.gamma",
    "output.weight": "head.weight",
    "blk.{i}.attn_norm.weight": "decoder.layers.{i}.add_norm_self.norm.gamma",
    "blk.{i}.ffn_norm.weight": "decoder.layers.{i}.add_norm_ffn.norm.gamma",
    "blk.{i}.attn_q.weight": "decoder.layers.{i}.self_attn.w_q.weight",
    "blk.{i}.attn_k.weight": "decoder.layers.{i}.self_attn.w_k.weight",
    "blk.{i}.attn_v.weight": "decoder.layers.{i}.self_attn.w_v.weight",
    "blk.{i}.attn_output.weight": "decoder.layers.{i}.self_attn.w_o.weight",
    "blk.{i}.ffn_gate.weight": "decoder.layers.{i}.ffn.w_1.weight",
    "blk.{i}.ffn_up.weight": "decoder.layers.{i}.ffn.w_3.weight",
    "blk.{i}.ffn_down.weight": "decoder.layers.{i}.ffn.w_2.weight",
}
_LAYER = re.compile(r"^blk\.(\d+)\.")


def _reader(path: Path) -> Any:
    from gguf import GGUFReader  # the gguf extra; the CLI turns its absence into one line

    class Reader(GGUFReader):
        """``gguf``'s reader over the file's map as a plain array: the reader takes a view of it
        for every part of every field (SmolLM2's 49k tokens and merges: 1.2 million views), and
        a ``np.memmap`` view runs Python code of numpy's for each (2.1-2.3 s to open the file,
        against 0.7 s as a plain array over the same map; the same fields and tensors)."""

        @property
        def data(self) -> np.ndarray:
            return self._data

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._data = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    if not path.is_file():
        raise FileNotFoundError(f"{path} is not a file")
    try:
        return Reader(str(path))
    except (ValueError, OSError, KeyError, IndexError) as err:
        raise ValueError(f"{path} is not a readable GGUF file ({err})") from None


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _number(reader: Any, key: str, path: Path, kind: type = int, default: Any = None) -> Any:
    """A numeric metadata value; a missing (without ``default``) or non-numeric one is one line."""
    value = _field(reader, key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        found = "missing" if value is None else f"{value!r}"
        raise ValueError(f"{path}: GGUF key {key} is {found}, not a number; the file is incomplete, re-export it")
    return kind(value)


def config_of(reader: Any, path: Path) -> ModelConfig:
    architecture = _field(reader, "general.architecture")
    if architecture != "llama":
        raise ValueError(f"{path}: GGUF architecture {architecture!r} is not one attnkit reads (only 'llama')")
    heads = _number(reader, "llama.attention.head_count", path)
    names = {t.name for t in reader.tensors}
    vocab = _field(reader, "llama.vocab_size") or len(_field(reader, "tokenizer.ggml.tokens", []))
    return preset(
        "llama-tiny",
        vocab_size=int(vocab),
        d_model=_number(reader, "llama.embedding_length", path),
        n_heads=heads,
        n_kv_heads=_number(reader, "llama.attention.head_count_kv", path, default=heads),
        n_layers=_number(reader, "llama.block_count", path),
        d_ff=_number(reader, "llama.feed_forward_length", path),
        max_len=_number(reader, "llama.context_length", path, default=2048),
        eps=_number(reader, "llama.attention.layer_norm_rms_epsilon", path, float, 1e-5),
        rope_theta=_number(reader, "llama.rope.freq_base", path, float, 10000.0),
        tie_embeddings="output.weight" not in names,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
        pad_token_id=_field(
            reader, "tokenizer.ggml.padding_token_id", _field(reader, "tokenizer.ggml.eos_token_id", 0)
        ),
    )


def _unpermute(w: Tensor, heads: int) -> Tensor:
    """llama.cpp's interleaved rotary rows of a query/key projection -> Llama's halves layout.
    (out, in): per head, rows (2j, 2j+1) -> (j, j + d/2)."""
    out, d_in = w.shape
    return w.reshape(heads, out // heads // 2, 2, d_in).transpose(1, 2).reshape(out, d_in)


# GGUF's block types attnkit computes on as they are: its layout, bytes per block, header bytes
# (the fp16 scale, and Q4_1's fp16 minimum) before the values.
_BLOCKS = {"Q8_0": ("q8_0", 34, 2), "Q4_0": ("q4_0", 18, 2), "Q4_1": ("q4_1", 20, 4)}
_FLOATS = ("F32", "F16", "BF16", "F64")  # not blocks: loaded as float
_Q4_K_BYTES = 144  # a Q4_K superblock of 256: fp16 d and dmin, 12 bytes of 6-bit scales and minima, 128 of values


def _raw_blocks(tensor: Any, path: Path, size: int) -> Tensor:
    """A quantised tensor's bytes as (rows, blocks, size) uint8; a truncated tensor names itself."""
    raw = torch.from_numpy(np.array(tensor.data, dtype=np.uint8))
    if raw.dim() != 2 or raw.shape[1] % size:
        raise ValueError(
            f"{path}: tensor {tensor.name} ({tensor.tensor_type.name}) has {tuple(raw.shape)} bytes, not whole "
            f"blocks of {size}; the file is truncated or corrupt"
        )
    return raw.reshape(raw.shape[0], -1, size)


def _finite(tensor: Any, path: Path, *scales: Tensor | None) -> None:
    if not all(bool(torch.isfinite(t).all()) for t in scales if t is not None):
        raise ValueError(f"{path}: tensor {tensor.name} has a block scale that is NaN or Inf; the file is corrupt")


def _split_blocks(tensor: Any, path: Path) -> tuple[str, Tensor, Tensor, Tensor | None]:
    """A Q8_0/Q4_0/Q4_1 tensor's bytes (rows, blocks · size) as separate values, fp16 scales and
    (Q4_1) minima, copied without dequantising; a truncated or non-finite block names the tensor."""
    layout, size, header = _BLOCKS[tensor.tensor_type.name]
    raw = _raw_blocks(tensor, path, size)  # (rows, blocks, size)
    d = raw[..., 0:2].contiguous().view(torch.float16).squeeze(-1)  # (rows, blocks)
    m = raw[..., 2:4].contiguous().view(torch.float16).squeeze(-1) if layout == "q4_1" else None
    _finite(tensor, path, d, m)
    data = raw[..., header:].reshape(raw.shape[0], -1)
    return layout, data.view(torch.int8) if layout == "q8_0" else data.contiguous(), d, m


def _q4_k_blocks(tensor: Any, path: Path) -> tuple[str, Tensor, Tensor, Tensor]:
    """A Q4_K tensor as Q4_1 blocks: the values as they are (rearranged into Q4_1's nibble order),
    each block of 32's scale ``d · sc`` and minimum ``-dmin · m`` rounded to fp16 (llama.cpp's
    ``get_scale_min_k4`` unpacks the 6-bit ``sc`` and ``m``)."""
    raw = _raw_blocks(tensor, path, _Q4_K_BYTES)  # (rows, supers, 144)
    d, dmin = (raw[..., i : i + 2].contiguous().view(torch.float16).float() for i in (0, 2))  # (rows, supers, 1)
    low, high, extra = raw[..., 4:8], raw[..., 8:12], raw[..., 12:16]  # the 12 bytes of scales and minima
    sc = torch.cat([low & 63, (extra & 15) | ((low >> 2) & 48)], -1).float()  # (rows, supers, 8)
    mn = torch.cat([high & 63, (extra >> 4) | ((high >> 2) & 48)], -1).float()
    scale, minimum = (d * sc).half(), (-dmin * mn).half()
    _finite(tensor, path, scale, minimum)
    qs = raw[..., 16:].reshape(*raw.shape[:2], 4, 32)  # 4 runs of 32 bytes: blocks 2c (low nibbles), 2c + 1 (high)
    u = torch.stack([qs & 15, qs >> 4], dim=3).reshape(raw.shape[0], -1, 32)  # (rows, blocks, 32)
    data = (u[..., :16] | (u[..., 16:] << 4)).reshape(raw.shape[0], -1)  # Q4_1's order: u_i low, u_{i+16} high
    return "q4_1", data, scale.reshape(raw.shape[0], -1), minimum.reshape(raw.shape[0], -1)


def _requantised(values: Tensor) -> tuple[str, Tensor, Tensor, None]:
    """Another quantised type's values (rows, k) as Q8_0 blocks (GGML's blocks are all of 32 or 256
    values: k is a multiple of 32)."""
    from attnkit.kernels import quantize

    return "q8_0", *quantize(values, "q8_0")  # type: ignore[return-value]


def _blocks_of(tensor: Any, path: Path, values: Any) -> tuple[str, Tensor, Tensor, Tensor | None]:
    """A quantised tensor's blocks for the kernel (module docstring); ``values`` gives its
    dequantised values (rows, k) where it is requantised."""
    kind = tensor.tensor_type.name
    if kind in _BLOCKS:
        return _split_blocks(tensor, path)
    if kind == "Q4_K":
        return _q4_k_blocks(tensor, path)
    return _requantised(values())


def _unpermuted(template: str, cfg: ModelConfig, w: Tensor) -> Tensor:
    if template == "blk.{i}.attn_q.weight":
        return _unpermute(w, cfg.n_heads)
    if template == "blk.{i}.attn_k.weight":
        return _unpermute(w, cfg.n_kv_heads or cfg.n_heads)
    return w


def tensors_of(
    reader: Any, cfg: ModelConfig, path: Path, keep_blocks: bool = False
) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Every tensor renamed, q/k rows back in Llama's layout: dequantised to float32, or with
    ``keep_blocks`` the quantised linear maps as blocks (module docstring; the tensors of a
    :class:`~attnkit.nn.quantized.BlockLinear`; a tied embedding is both dequantised and kept
    for the head), with those layers' layouts by name ("head" for the vocabulary projection)."""
    from attnkit.nn.quantized import block_tensors

    out: dict[str, Tensor] = {}
    kept: dict[str, str] = {}
    tied = all(t.name != "output.weight" for t in reader.tensors)
    for tensor in reader.tensors:
        layer = _LAYER.match(tensor.name)
        template = _LAYER.sub("blk.{i}.", tensor.name) if layer else tensor.name
        if template not in _NAMES:
            raise ValueError(f"{path}: tensor {tensor.name!r} is not one of a Llama GGUF's")
        name = _NAMES[template].format(i=layer.group(1) if layer else "")
        values = functools.cache(functools.partial(_values, tensor, path))
        if keep_blocks and tensor.tensor_type.name not in _FLOATS and template != "output_norm.weight":
            layout, *blocks = _blocks_of(tensor, path, values)
            data, d, m = (None if t is None else _unpermuted(template, cfg, t) for t in blocks)
            target = "head" if template in ("output.weight", "token_embd.weight") else name.removesuffix(".weight")
            if template != "token_embd.weight" or tied:  # a tied embedding is also looked up in fp32, below
                kept[target] = layout
                out.update(block_tensors(target, data, d, m))
            if template != "token_embd.weight":
                continue
        out[name] = _unpermuted(template, cfg, values())
    return out, kept


def _values(tensor: Any, path: Path) -> Tensor:
    """A tensor's values in fp32, dequantised by the ``gguf`` package: (rows, k) for a matrix."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    try:
        values = dequantize(tensor.data, GGMLQuantizationType(tensor.tensor_type))
    except (NotImplementedError, ValueError) as err:
        raise ValueError(
            f"{path}: tensor {tensor.name} has type {tensor.tensor_type!r}, which cannot be read: {err}"
        ) from None
    shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))  # GGUF lists dimensions innermost first
    try:
        return torch.from_numpy(np.array(values, dtype=np.float32).reshape(shape))  # a writable copy
    except ValueError:
        raise ValueError(
            f"{path}: tensor {tensor.name} does not hold {shape} values; the file is truncated or corrupt"
        ) from None


def tokenizer_of(reader: Any, path: Path) -> Tokenizer:
    """The byte-level BPE tokenizer a ``gpt2``-model GGUF carries (tokens, merges, control
    tokens as special tokens)."""
    from tokenizers import AddedToken
    from tokenizers.models import BPE

    from attnkit.data.tokenizer import byte_level_bpe

    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"{path}: tokenizer model {kind!r} is not one attnkit reads from GGUF (only 'gpt2' BPE)")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    kinds = _field(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
    bpe = BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False)
    tokenizer = byte_level_bpe(bpe, split_digits=_field(reader, "tokenizer.ggml.pre") == "smollm")
    special = [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, kinds, strict=True) if k == 3]
    tokenizer.add_special_tokens(special)
    return tokenizer


def load_gguf(path: str | Path, keep_blocks: bool = False) -> Model:
    """The attnkit model of a Llama GGUF file, with its tokenizer (``model.tokenizer``) and chat
    template (``model.chat_template``, where the file has one): fp32, or with ``keep_blocks``
    its quantised linear maps kept as blocks (the module docstring; ``weights="gguf"``)."""
    from attnkit.models.weights import finish_format

    path = Path(path)
    reader = _reader(path)
    cfg = config_of(reader, path)
    tensors, layers = tensors_of(reader, cfg, path, keep_blocks)
    model = build_loaded(cfg, tensors, str(path), layers)  # the blocks checked as a saved model's are
    if layers:
        finish_format(model, "gguf")
    model.tokenizer = tokenizer_of(reader, path)
    model.chat_template = _field(reader, "tokenizer.chat_template")
    return model.eval()
