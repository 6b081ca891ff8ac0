"""Marian (``model_type: marian``, ``MarianMTModel``) <-> attnkit's encoder–decoder Transformer.

Marian is the paper's model with a different FFN activation (swish = SiLU), its sinusoidal
positions laid out in halves (all sines, then all cosines), one embedding shared by the
encoder, the decoder and the pre-softmax map, and a per-token logit bias
(``final_logits_bias``): post-LN, no embedding LayerNorm, no final norms, LayerNorm eps 1e-5.

Position tables. ``transformers`` recomputes ``embed_positions.weight`` when a file lacks it
(its own ``save_pretrained`` never writes it) but loads it from the file when present, so
old checkpoints that carry it are checked here against the table attnkit computes, then
dropped. Export never relies on the table: a model with the chapter's interleaved
positions (``positional="sinusoidal"``) is written with its d_model coordinates permuted
(even ones first, then odd ones). That permutation turns the interleaved table into the
halves one and, applied to every weight that reads or writes the residual stream
(LayerNorm is per-coordinate after a permutation-invariant mean and variance), gives the
same logits. Read back, such an export is a ``sinusoidal-halves`` model with permuted weights.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attnkit.config import ModelConfig, preset
from attnkit.interop.hf.common import strip_prefix, token_id, unsupported
from attnkit.models import build_model
from attnkit.nn.positional import sinusoidal_table

# MarianConfig's defaults (transformers), for keys a config.json leaves out.
_HF_DEFAULTS: dict[str, Any] = {
    "vocab_size": 58101,
    "d_model": 1024,
    "encoder_layers": 12,
    "decoder_layers": 12,
    "encoder_attention_heads": 16,
    "decoder_attention_heads": 16,
    "encoder_ffn_dim": 4096,
    "decoder_ffn_dim": 4096,
    "activation_function": "gelu",
    "scale_embedding": False,
    "dropout": 0.1,
    "attention_dropout": 0.0,
    "max_position_embeddings": 1024,
    "init_std": 0.02,
    "pad_token_id": 58100,
    "decoder_start_token_id": 58100,
    "eos_token_id": 0,
    "bos_token_id": None,
}
# Options whose other values change the wiring (the last three are BART-era keys that old
# Marian configs still carry); attnkit's Transformer implements only these values.
_FIXED: dict[str, Any] = {
    "share_encoder_decoder_embeddings": True,
    "tie_word_embeddings": True,
    "encoder_layerdrop": 0.0,
    "decoder_layerdrop": 0.0,
    "normalize_before": False,
    "normalize_embedding": False,
    "add_final_layer_norm": False,
}
_ACTIVATIONS = {
    "swish": "silu",
    "silu": "silu",
    "relu": "relu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
}
_EXPORT_ACTIVATIONS = {"silu": "swish", "relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}
_EPS = 1e-5  # Marian's nn.LayerNorm default, not configurable there
# Every key the tied embedding may be stored under (after "model." is stripped).
_EMBEDDINGS = ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight")
_POSITIONS = ("encoder.embed_positions.weight", "decoder.embed_positions.weight")


def _same(data: dict[str, Any], a: str, b: str) -> None:
    if data[a] != data[b]:
        raise ValueError(f"{a}={data[a]!r} differs from {b}={data[b]!r}; attnkit's Transformer needs them equal")


def config_from_hf(data: dict[str, Any]) -> ModelConfig:

    unsupported(data, _FIXED, "marian")
    data = {**_HF_DEFAULTS, **data}
    if data.get("decoder_vocab_size") not in (None, data["vocab_size"]):
        raise ValueError(
            f"decoder_vocab_size={data['decoder_vocab_size']!r} differs from vocab_size={data['vocab_size']!r}; "
            "attnkit's Transformer shares one vocabulary"
        )
    _same(data, "encoder_attention_heads", "decoder_attention_heads")
    _same(data, "encoder_ffn_dim", "decoder_ffn_dim")
    act = data["activation_function"]
    if act not in _ACTIVATIONS:
        raise ValueError(f"activation_function {act!r} is not supported (one of {sorted(_ACTIVATIONS)})")
    n_layers, n_decoder_layers = data["encoder_layers"], data["decoder_layers"]
    pad = token_id(data, "pad_token_id")
    return preset(
        "transformer-base",
        vocab_size=data["vocab_size"],
        d_model=data["d_model"],
        n_heads=data["encoder_attention_heads"],
        d_ff=data["encoder_ffn_dim"],
        n_layers=n_layers,
        n_decoder_layers=None if n_decoder_layers == n_layers else n_decoder_layers,
        max_len=data["max_position_embeddings"],
        dropout=data["dropout"],
        attention_dropout=data["attention_dropout"],
        activation=_ACTIVATIONS[act],
        eps=_EPS,
        positional="sinusoidal-halves",
        scale_embeddings=data["scale_embedding"],
        tie_embeddings=True,
        logits_bias=True,
        pad_token_id=0 if pad is None else pad,
        bos_token_id=token_id(data, "bos_token_id"),
        eos_token_id=token_id(data, "eos_token_id"),
        decoder_start_token_id=token_id(data, "decoder_start_token_id"),
    )


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    if cfg.family != "transformer":
        raise ValueError(f"only the 'transformer' family exports to marian, got {cfg.family!r}")
    if cfg.positional not in ("sinusoidal", "sinusoidal-halves"):
        raise ValueError(
            f"marian has fixed sinusoidal positions; positional={cfg.positional!r} has no marian equivalent "
            "(use 'sinusoidal-halves', or 'sinusoidal', exported with permuted coordinates)"
        )
    problems = []
    if cfg.norm_first or cfg.norm != "layer" or cfg.eps != _EPS:
        problems.append(f"marian is post-LN with LayerNorm eps {_EPS} (norm_first=False, norm='layer', eps=1e-05)")
    if cfg.activation not in _EXPORT_ACTIVATIONS or cfg.gated or not cfg.bias:
        problems.append(f"marian's FFN is ungated with biases and one of {sorted(_EXPORT_ACTIVATIONS)}")
    if not cfg.scale_scores or cfg.d_k not in (None, cfg.d_model // cfg.n_heads):
        problems.append("marian's attention scales by 1/sqrt(d_k) with d_k = d_model / n_heads")
    if not cfg.tie_embeddings or cfg.embedding_norm or cfg.head_scale:
        problems.append("marian ties its embeddings and head, without embedding_norm or head_scale")
    if problems:
        raise ValueError("this model has no marian equivalent: " + "; ".join(problems))
    start = cfg.pad_token_id if cfg.decoder_start_token_id is None else cfg.decoder_start_token_id
    return {
        "model_type": "marian",
        "architectures": ["MarianMTModel"],
        "vocab_size": cfg.vocab_size,
        "decoder_vocab_size": cfg.vocab_size,
        "d_model": cfg.d_model,
        "encoder_layers": cfg.n_layers,
        "decoder_layers": cfg.decoder_layers,
        "encoder_attention_heads": cfg.n_heads,
        "decoder_attention_heads": cfg.n_heads,
        "encoder_ffn_dim": cfg.d_ff,
        "decoder_ffn_dim": cfg.d_ff,
        "max_position_embeddings": cfg.max_len,
        "activation_function": _EXPORT_ACTIVATIONS[cfg.activation],
        "scale_embedding": cfg.scale_embeddings,
        "dropout": cfg.dropout,
        "attention_dropout": cfg.dropout if cfg.attention_dropout is None else cfg.attention_dropout,
        "activation_dropout": cfg.dropout,  # attnkit's FFN drops its hidden units at the model's rate
        "share_encoder_decoder_embeddings": True,
        "tie_word_embeddings": True,
        "is_encoder_decoder": True,
        "init_std": cfg.init_std,
        "pad_token_id": cfg.pad_token_id,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "forced_eos_token_id": cfg.eos_token_id,  # MarianConfig's default (0) would force token 0 otherwise
        "decoder_start_token_id": start,
    }


def _renames(cfg: ModelConfig) -> dict[str, str]:
    """attnkit name -> Marian name (without the ``model.`` prefix), for tensors that map one to one."""
    names = {}
    attention = {"w_q": "q_proj", "w_k": "k_proj", "w_v": "v_proj", "w_o": "out_proj"}
    blocks = [("self_attn", "self_attn", "add_norm_self", "self_attn_layer_norm")]
    for side, n_layers in (("encoder", cfg.n_layers), ("decoder", cfg.decoder_layers)):
        if side == "decoder":
            blocks.append(("cross_attn", "encoder_attn", "add_norm_cross", "encoder_attn_layer_norm"))
        for i in range(n_layers):
            ours, theirs = f"{side}.layers.{i}.", f"{side}.layers.{i}."
            linears = [(f"ffn.{a}", b) for a, b in (("w_1", "fc1"), ("w_2", "fc2"))]
            norms = [("add_norm_ffn.norm", "final_layer_norm")]
            for attn, hf_attn, norm, hf_norm in blocks:
                linears += [(f"{attn}.{a}", f"{hf_attn}.{b}") for a, b in attention.items()]
                norms.append((f"{norm}.norm", hf_norm))
            for a, b in linears:
                names[f"{ours}{a}.weight"], names[f"{ours}{a}.bias"] = f"{theirs}{b}.weight", f"{theirs}{b}.bias"
            for a, b in norms:
                names[f"{ours}{a}.gamma"], names[f"{ours}{a}.beta"] = f"{theirs}{b}.weight", f"{theirs}{b}.bias"
    return names


def _expected_shapes(cfg: ModelConfig) -> dict[str, torch.Size]:
    """attnkit's parameter shapes for ``cfg``, from a model built on the meta device (no memory)."""
    with torch.device("meta"):
        model = build_model(cfg)
    return {name: p.shape for name, p in model.named_parameters()}


def _check_positions(name: str, table: Tensor, cfg: ModelConfig) -> None:
    """A stored position table must be the one attnkit computes (rows: max_position_embeddings)."""
    layout = "halves" if cfg.positional == "sinusoidal-halves" else "interleaved"
    if table.dim() != 2 or table.shape[1] != cfg.d_model or not table.dtype.is_floating_point:
        raise ValueError(
            f"{name}: shape {tuple(table.shape)}, dtype {table.dtype} in the file; expected a floating-point "
            f"(max_position_embeddings, {cfg.d_model}) sinusoidal table"
        )
    expected = sinusoidal_table(table.shape[0], cfg.d_model, layout=layout)
    diff = float((table.float() - expected).abs().max()) if table.numel() else 0.0
    tolerance = max(1e-6, torch.finfo(table.dtype).eps)
    if not diff <= tolerance:  # also catches NaN
        raise ValueError(
            f"{name} is not the sinusoidal table attnkit computes (sines in the first half, cosines in the "
            f"second; max abs difference {diff:.3g}); attnkit cannot load these positions"
        )


def to_attnkit(tensors: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:

    src = strip_prefix(tensors, "model.")  # MarianMTModel nests MarianModel's keys under "model."
    named = {k.removeprefix("model."): k for k in tensors}  # errors name the file's own keys
    out: dict[str, Tensor] = {}
    stored = [k for k in _EMBEDDINGS if k in src]  # one tied matrix, under one or more names
    if stored:
        first = src[stored[0]]
        for key in stored[1:]:
            if src[key].shape != first.shape or not torch.equal(src[key], first):
                raise ValueError(
                    f"{named[key]} differs from {named[stored[0]]}; attnkit's Transformer ties the encoder and "
                    "decoder embeddings and the head (share_encoder_decoder_embeddings, tie_word_embeddings)"
                )
        out["embeddings.token.weight"] = first
        for key in stored:
            del src[key]
    for key in _POSITIONS:
        if key in src:
            _check_positions(named[key], src.pop(key), cfg)
    bias = src.pop("final_logits_bias", None)
    if bias is None:  # transformers starts a missing bias at zero
        dtype = first.dtype if stored and first.dtype.is_floating_point else torch.float32
        out["head.bias"] = torch.zeros(cfg.vocab_size, dtype=dtype)
    elif bias.shape not in ((1, cfg.vocab_size), (cfg.vocab_size,)):
        raise ValueError(f"final_logits_bias: shape {tuple(bias.shape)} in the file, expected (1, {cfg.vocab_size})")
    else:
        out["head.bias"] = bias.reshape(cfg.vocab_size)
    shapes, problems = _expected_shapes(cfg), []
    if stored and first.shape != shapes["embeddings.token.weight"]:
        expected = tuple(shapes["embeddings.token.weight"])
        problems.append(f"{named[stored[0]]}: shape {tuple(first.shape)} in the file, expected {expected}")
    for ours, theirs in _renames(cfg).items():
        if theirs in src:
            t = src.pop(theirs)
            if t.shape != shapes[ours]:
                problems.append(f"{named[theirs]}: shape {tuple(t.shape)} in the file, expected {tuple(shapes[ours])}")
            out[ours] = t
    if problems:
        raise ValueError("; ".join(problems))
    out.update({f"<marian> {named[k]}": v for k, v in src.items()})  # left over: reported as unexpected
    return out


def _residual_permutation(cfg: ModelConfig) -> Tensor | None:
    """The coordinate order that turns the interleaved table into the halves one:
    ``halves[:, j] == interleaved[:, perm[j]]`` (even coordinates, then odd ones)."""
    if cfg.positional != "sinusoidal":
        return None
    return torch.cat([torch.arange(0, cfg.d_model, 2), torch.arange(1, cfg.d_model, 2)])


def _permute(name: str, t: Tensor, perm: Tensor) -> Tensor:
    """Re-index the residual-stream (d_model) axes of one attnkit tensor by ``perm``."""
    reads = (".w_q.weight", ".w_k.weight", ".w_v.weight", ".w_1.weight", "embeddings.token.weight")
    writes = (".w_o.weight", ".w_2.weight")
    if name.endswith(reads):
        return t[:, perm]  # (out, d_model): input coordinates
    if name.endswith(writes):
        return t[perm]  # (d_model, in): output coordinates
    if name.endswith((".w_o.bias", ".w_2.bias", ".gamma", ".beta")):
        return t[perm]
    return t  # q/k/v and FFN hidden biases, the logit bias: not on the residual stream


def to_hf(tensors: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    perm = _residual_permutation(cfg)
    if perm is not None:
        tensors = {name: _permute(name, t, perm) for name, t in tensors.items()}
    out = {f"model.{theirs}": tensors[ours] for ours, theirs in _renames(cfg).items()}
    embedding = tensors["embeddings.token.weight"]
    out["model.shared.weight"] = embedding  # transformers ties encoder, decoder and lm_head to it
    bias = tensors.get("head.bias")
    out["final_logits_bias"] = (torch.zeros(cfg.vocab_size, dtype=embedding.dtype) if bias is None else bias)[None]
    return out
