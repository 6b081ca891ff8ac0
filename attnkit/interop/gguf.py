"""GGUF files (llama.cpp's format) in: a Llama checkpoint, its quantised blocks dequantised, and
its byte-level BPE tokenizer, read with the ``gguf`` package into attnkit's own model.

The only place that knows GGUF's tensor and metadata names. llama.cpp stores the query and
key projections permuted for its interleaved rotary layout; they are permuted back to
Llama's halves layout, so the model is the one ``transformers`` loads from the same file.
"""

from __future__ import annotations

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

    if not path.is_file():
        raise FileNotFoundError(f"{path} is not a file")
    try:
        return GGUFReader(str(path))
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


def tensors_of(reader: Any, cfg: ModelConfig, path: Path) -> dict[str, Tensor]:
    """Every tensor dequantised to float32, renamed, q/k rows back in Llama's layout."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    out: dict[str, Tensor] = {}
    for tensor in reader.tensors:
        layer = _LAYER.match(tensor.name)
        template = _LAYER.sub("blk.{i}.", tensor.name) if layer else tensor.name
        if template not in _NAMES:
            raise ValueError(f"{path}: tensor {tensor.name!r} is not one of a Llama GGUF's")
        try:
            values = dequantize(tensor.data, GGMLQuantizationType(tensor.tensor_type))
        except (NotImplementedError, ValueError) as err:
            raise ValueError(
                f"{path}: tensor {tensor.name} has type {tensor.tensor_type!r}, which cannot be read: {err}"
            ) from None
        shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))  # GGUF lists dimensions innermost first
        weight = torch.from_numpy(np.array(values, dtype=np.float32).reshape(shape))  # a writable copy
        name = _NAMES[template].format(i=layer.group(1) if layer else "")
        if template == "blk.{i}.attn_q.weight":
            weight = _unpermute(weight, cfg.n_heads)
        elif template == "blk.{i}.attn_k.weight":
            weight = _unpermute(weight, cfg.n_kv_heads or cfg.n_heads)
        out[name] = weight
    return out


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


def load_gguf(path: str | Path) -> Model:
    """The attnkit model of a Llama GGUF file, fp32, with its tokenizer (``model.tokenizer``)
    and chat template (``model.chat_template``, where the file has one)."""
    path = Path(path)
    reader = _reader(path)
    cfg = config_of(reader, path)
    tensors = tensors_of(reader, cfg, path)
    model = build_loaded(cfg, tensors, str(path))
    model.tokenizer = tokenizer_of(reader, path)
    model.chat_template = _field(reader, "tokenizer.chat_template")
    return model.eval()
