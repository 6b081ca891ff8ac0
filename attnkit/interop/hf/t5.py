"""T5 (``model_type: t5``, ``T5ForConditionalGeneration``) <-> attnkit's T5.

Both generations load: v1.0 (``feed_forward_proj: relu``, head tied to the embedding and fed
d_model^-0.5 × the decoder output) and v1.1 / Flan-T5 (``gated-gelu``, an untied, unscaled head).

The head needs care. Older ``transformers`` scale the decoder output exactly when
``tie_word_embeddings`` is true; ``transformers`` 5 records the scaling as
``scale_decoder_outputs``, always writes ``tie_word_embeddings: true`` (even for v1.1) and ties
the head to ``shared.weight`` unless the file holds an ``lm_head.weight`` that differs from it.
So attnkit reads the scaling from ``scale_decoder_outputs`` where present (else from
``tie_word_embeddings``), and the tying from the tensors, as transformers 5 does
(:func:`config_from_tensors`). From ``config.json`` alone an unscaled head is taken to be
v1.1's untied one, filled from ``shared.weight`` when the file has none: the same logits.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attnkit.config import ModelConfig, preset
from attnkit.interop.hf.common import token_id, unsupported

# feed_forward_proj is "[gated-]ACT" with ACT a transformers activation name.
_ACTIVATIONS = {
    "relu": "relu",
    "gelu": "gelu",  # exact erf GELU, except in "gated-gelu" (see below)
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "silu": "silu",
    "swish": "silu",
}
# attnkit (activation, gated) -> feed_forward_proj. transformers reads "gated-gelu" as the tanh
# GELU (gelu_new, T5 v1.1's), so a gated exact-erf GELU has no name.
_FEED_FORWARD = {
    ("relu", False): "relu",
    ("gelu", False): "gelu",
    ("gelu_tanh", False): "gelu_new",
    ("silu", False): "silu",
    ("relu", True): "gated-relu",
    ("gelu_tanh", True): "gated-gelu",
    ("silu", True): "gated-silu",
}

# Tied copies of shared.weight that checkpoints may or may not keep.
_EMBEDDING_COPIES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
# Old checkpoints (t5-small) carry a cross-attention bias that T5 never uses; transformers
# ignores it on load, and so does attnkit.
_IGNORED = ("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",)


def _feed_forward(proj: str) -> tuple[str, bool]:
    """``feed_forward_proj`` -> (attnkit activation, gated), parsed as transformers does."""
    parts = proj.split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise ValueError(f"feed_forward_proj {proj!r} is not of the form 'ACT' or 'gated-ACT'")
    gated, act = len(parts) == 2, parts[-1]
    if proj == "gated-gelu":
        return "gelu_tanh", True  # transformers' backward-compatible reading: gelu_new
    if act not in _ACTIVATIONS:
        raise ValueError(f"feed_forward_proj {proj!r}: activation {act!r} is not supported ({sorted(_ACTIVATIONS)})")
    return _ACTIVATIONS[act], gated


def _scales_head(data: dict[str, Any]) -> bool:
    if "scale_decoder_outputs" in data:
        return bool(data["scale_decoder_outputs"])
    return data.get("tie_word_embeddings", True) is not False


def config_from_hf(data: dict[str, Any]) -> ModelConfig:

    unsupported(data, {"is_encoder_decoder": True, "is_decoder": False}, "t5")
    activation, gated = _feed_forward(data.get("feed_forward_proj", "relu"))
    head_scale = _scales_head(data)
    n_layers = data.get("num_layers", 6)
    n_decoder_layers = data.get("num_decoder_layers")
    pad = token_id(data, "pad_token_id")
    start = token_id(data, "decoder_start_token_id")
    return preset(
        "t5-small",
        vocab_size=data["vocab_size"],
        d_model=data.get("d_model", 512),
        d_k=data.get("d_kv", 64),
        d_ff=data.get("d_ff", 2048),
        n_layers=n_layers,
        n_decoder_layers=None if n_decoder_layers in (None, n_layers) else n_decoder_layers,
        n_heads=data.get("num_heads", 8),
        relative_buckets=data.get("relative_attention_num_buckets", 32),
        relative_max_distance=data.get("relative_attention_max_distance", 128),
        dropout=data.get("dropout_rate", 0.1),
        eps=data.get("layer_norm_epsilon", 1e-6),
        activation=activation,
        gated=gated,
        head_scale=head_scale,
        # an unscaled head is v1.1's untied one (see the module docstring)
        tie_embeddings=head_scale and data.get("tie_word_embeddings", True) is not False,
        max_len=data.get("n_positions") or 512,  # informational: relative positions have no limit
        pad_token_id=0 if pad is None else pad,
        eos_token_id=token_id(data, "eos_token_id"),
        decoder_start_token_id=(0 if pad is None else pad) if start is None else start,
    )


def _shared(tensors: dict[str, Tensor]) -> Tensor | None:
    """The token embedding: ``shared.weight``, or a stack's copy of it where only that is kept."""
    for name in ("shared.weight", *_EMBEDDING_COPIES):
        if name in tensors:
            return tensors[name]
    return None


def config_from_tensors(cfg: ModelConfig, tensors: dict[str, Tensor]) -> ModelConfig:
    """Tie the head exactly when transformers 5 does: unless ``lm_head.weight`` is in the file
    and differs from the token embedding."""
    shared, head = _shared(tensors), tensors.get("lm_head.weight")
    tied = shared is None or head is None or _same(head, shared)
    return cfg if cfg.tie_embeddings == tied else cfg.replace(tie_embeddings=tied)


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    if (
        cfg.family != "t5"
        or cfg.positional != "relative"
        or cfg.norm != "rms"
        or not cfg.norm_first
        or cfg.bias
        or cfg.scale_scores
        or cfg.logits_bias
        or not cfg.lm_head
    ):
        raise ValueError(
            "only T5-shaped models (relative bias, pre-LN RMSNorm, no biases, unscaled scores, a plain head) "
            "export to t5"
        )
    if cfg.attention_dropout not in (None, cfg.dropout):
        raise ValueError("t5 has a single dropout_rate; attention_dropout must be null or equal to dropout")
    if (cfg.activation, cfg.gated) not in _FEED_FORWARD:
        raise ValueError(
            f"a {'gated ' if cfg.gated else ''}{cfg.activation} FFN has no t5 feed_forward_proj "
            "('gated-gelu' is the tanh GELU)"
        )
    return {
        "model_type": "t5",
        "architectures": ["T5ForConditionalGeneration"],
        "is_encoder_decoder": True,
        "vocab_size": cfg.vocab_size,
        "d_model": cfg.d_model,
        "d_kv": cfg.d_k or cfg.d_model // cfg.n_heads,
        "d_ff": cfg.d_ff,
        "num_layers": cfg.n_layers,
        "num_decoder_layers": cfg.decoder_layers,
        "num_heads": cfg.n_heads,
        "relative_attention_num_buckets": cfg.relative_buckets,
        "relative_attention_max_distance": cfg.relative_max_distance,
        "dropout_rate": cfg.dropout,
        "layer_norm_epsilon": cfg.eps,
        "initializer_factor": 1.0,
        "feed_forward_proj": _FEED_FORWARD[(cfg.activation, cfg.gated)],
        # older transformers scale exactly when tied; transformers 5 reads scale_decoder_outputs
        "tie_word_embeddings": cfg.tie_embeddings,
        "scale_decoder_outputs": cfg.head_scale,
        "pad_token_id": cfg.pad_token_id,
        "eos_token_id": cfg.eos_token_id,
        "decoder_start_token_id": cfg.pad_token_id
        if cfg.decoder_start_token_id is None
        else cfg.decoder_start_token_id,
    }


def _ffn_names(cfg: ModelConfig) -> tuple[tuple[str, str], ...]:
    if cfg.gated:  # wi_0 goes through the activation, wi_1 is the linear gate
        return (("ffn.w_1", "wi_0"), ("ffn.w_3", "wi_1"), ("ffn.w_2", "wo"))
    return (("ffn.w_1", "wi"), ("ffn.w_2", "wo"))


def _renames(cfg: ModelConfig) -> dict[str, str]:
    """attnkit name -> T5 name, all one to one and in the same layout."""
    names = {"embeddings.token.weight": "shared.weight"}
    for stack in ("encoder", "decoder"):  # one bias per stack, kept by block 0's self-attention
        names[f"{stack}.final_norm.gamma"] = f"{stack}.final_layer_norm.weight"
        names[f"{stack}.position_bias.embedding.weight"] = (
            f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
        )
    ffn = _ffn_names(cfg)
    stacks = (
        ("encoder", cfg.n_layers, (("self_attn", "add_norm_self", "SelfAttention"),), ("add_norm_ffn", 1)),
        (
            "decoder",
            cfg.decoder_layers,
            (("self_attn", "add_norm_self", "SelfAttention"), ("cross_attn", "add_norm_cross", "EncDecAttention")),
            ("add_norm_ffn", 2),
        ),
    )
    for stack, n, attentions, (ffn_norm, ffn_index) in stacks:
        for i in range(n):
            ours, theirs = f"{stack}.layers.{i}.", f"{stack}.block.{i}.layer."
            for j, (attn, norm, module) in enumerate(attentions):
                for a, b in (("w_q", "q"), ("w_k", "k"), ("w_v", "v"), ("w_o", "o")):
                    names[f"{ours}{attn}.{a}.weight"] = f"{theirs}{j}.{module}.{b}.weight"
                names[f"{ours}{norm}.norm.gamma"] = f"{theirs}{j}.layer_norm.weight"
            for a, b in ffn:
                names[f"{ours}{a}.weight"] = f"{theirs}{ffn_index}.DenseReluDense.{b}.weight"
            names[f"{ours}{ffn_norm}.norm.gamma"] = f"{theirs}{ffn_index}.layer_norm.weight"
    if not cfg.tie_embeddings:
        names["head.weight"] = "lm_head.weight"
    return names


def _same(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and bool(torch.equal(a, b))


def to_attnkit(tensors: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    src = {k: v for k, v in tensors.items() if k not in _IGNORED}
    shared = _shared(src)
    if shared is not None:
        src["shared.weight"] = shared
        for copy in _EMBEDDING_COPIES:  # tied copies of shared.weight
            if copy in src and not _same(src.pop(copy), shared):
                raise ValueError(
                    f"{copy} differs from shared.weight: T5 with separate encoder and decoder embeddings "
                    "is not supported"
                )
        if cfg.tie_embeddings:  # a tied copy goes; one that differs is left over, reported
            if "lm_head.weight" in src and _same(src["lm_head.weight"], shared):
                del src["lm_head.weight"]
        elif "lm_head.weight" not in src:
            src["lm_head.weight"] = shared.clone()  # transformers 5 ties an absent head to shared
    out: dict[str, Tensor] = {}
    for ours, theirs in _renames(cfg).items():
        if theirs in src:
            out[ours] = src.pop(theirs)
    out.update({f"<t5> {k}": v for k, v in src.items()})  # left over: reported as unexpected
    return out


def to_hf(tensors: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    return {theirs: tensors[ours] for ours, theirs in _renames(cfg).items()}
