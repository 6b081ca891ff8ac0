"""GPT-2 (``model_type: gpt2``) <-> attnkit's GPT: ``GPT2LMHeadModel``, and
``GPT2ForSequenceClassification`` (its ``score`` layer, reading the last token that is not
padding) <-> attnkit's GPT with ``labels`` and ``classifier_pooling="last"``."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attnkit.config import ModelConfig, preset
from attnkit.interop.hf.common import (
    label_names,
    labels_to_hf,
    lm_special_ids,
    special_ids_to_hf,
    strip_prefix,
    unsupported,
)

# GPT-2 keeps these attention-mask buffers in some checkpoints; they carry no weights.
_BUFFERS = (".attn.bias", ".attn.masked_bias")
_CLASSIFIER = "GPT2ForSequenceClassification"


def config_from_hf(data: dict[str, Any]) -> ModelConfig:

    unsupported(
        data,
        {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False},
        "gpt2",
    )
    activation = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
    act = data.get("activation_function", "gelu_new")
    if act not in activation:
        raise ValueError(f"activation_function {act!r} is not supported (one of {sorted(activation)})")
    d_model = data["n_embd"]
    classifier = {}
    if _CLASSIFIER in (data.get("architectures") or []):
        classifier = dict(labels=label_names(data), lm_head=False, classifier_pooling="last")
    return preset(
        "gpt2",
        vocab_size=data["vocab_size"],
        d_model=d_model,
        n_heads=data["n_head"],
        n_layers=data["n_layer"],
        d_ff=data.get("n_inner") or 4 * d_model,
        max_len=data["n_positions"],
        eps=data.get("layer_norm_epsilon", 1e-5),
        activation=activation[act],
        dropout=data.get("resid_pdrop", 0.1),
        attention_dropout=data.get("attn_pdrop", 0.1),
        init_std=data.get("initializer_range", 0.02),
        tie_embeddings=data.get("tie_word_embeddings", True),
        **lm_special_ids(data),
        **classifier,
    )


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    if cfg.family != "gpt" or cfg.positional != "learned" or not cfg.norm_first or cfg.norm != "layer":
        raise ValueError("only GPT-2-shaped models (learned positions, pre-LN LayerNorm) export to gpt2")
    activation = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
    if (
        cfg.activation not in activation
        or cfg.gated
        or not cfg.bias
        or cfg.d_k not in (None, cfg.d_model // cfg.n_heads)
    ):
        raise ValueError("this GPT's FFN or attention has no gpt2 equivalent (activation, gated, bias or d_k)")
    classifier = {}
    if cfg.labels:
        if cfg.classifier_pooling != "last" or cfg.pad_token_id is None:
            raise ValueError(
                f"{_CLASSIFIER} reads the last token that is not padding; this classifier pools by "
                f"{cfg.classifier_pooling!r}{'' if cfg.pad_token_id is not None else ' and has no pad_token_id'} "
                "and has no gpt2 equivalent"
            )
        classifier = labels_to_hf(cfg.labels)
    return classifier | {
        "model_type": "gpt2",
        "architectures": [_CLASSIFIER if cfg.labels else "GPT2LMHeadModel"],
        "vocab_size": cfg.vocab_size,
        "n_embd": cfg.d_model,
        "n_head": cfg.n_heads,
        "n_layer": cfg.n_layers,
        "n_inner": cfg.d_ff,
        "n_positions": cfg.max_len,
        "layer_norm_epsilon": cfg.eps,
        "activation_function": activation[cfg.activation],
        "resid_pdrop": cfg.dropout,
        "embd_pdrop": cfg.dropout,
        "attn_pdrop": cfg.dropout if cfg.attention_dropout is None else cfg.attention_dropout,
        "initializer_range": cfg.init_std,
        "tie_word_embeddings": cfg.tie_embeddings,
        **special_ids_to_hf(cfg),
    }


def _renames(cfg: ModelConfig) -> dict[str, str]:
    """attnkit name -> GPT-2 name, for tensors that map one to one (Conv1D ones transposed)."""
    names = {
        "embeddings.token.weight": "wte.weight",
        "embeddings.positions.weight": "wpe.weight",
        "decoder.final_norm.gamma": "ln_f.weight",
        "decoder.final_norm.beta": "ln_f.bias",
    }
    for i in range(cfg.n_layers):
        ours, theirs = f"decoder.layers.{i}.", f"h.{i}."
        for a, b in (("add_norm_self.norm", "ln_1"), ("add_norm_ffn.norm", "ln_2")):
            names[f"{ours}{a}.gamma"], names[f"{ours}{a}.beta"] = f"{theirs}{b}.weight", f"{theirs}{b}.bias"
        for a, b in (("self_attn.w_o", "attn.c_proj"), ("ffn.w_1", "mlp.c_fc"), ("ffn.w_2", "mlp.c_proj")):
            names[f"{ours}{a}.weight"], names[f"{ours}{a}.bias"] = f"{theirs}{b}.weight", f"{theirs}{b}.bias"
    if cfg.labels:
        names["classifier.1.weight"] = "score.weight"
    elif not cfg.tie_embeddings:
        names["head.weight"] = "lm_head.weight"
    return names


def _is_conv1d(name: str) -> bool:
    """GPT-2's Conv1D stores weights as (in, out), the transpose of nn.Linear's."""
    return name.endswith(".weight") and any(p in name for p in ("attn.c_", "mlp.c_"))


def to_attnkit(tensors: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:

    src = {k: v for k, v in strip_prefix(tensors, "transformer.").items() if not k.endswith(_BUFFERS)}
    if cfg.tie_embeddings:
        src.pop("lm_head.weight", None)  # a tied copy of wte, when the file keeps one
    out: dict[str, Tensor] = {}
    for ours, theirs in _renames(cfg).items():
        if theirs in src:
            t = src.pop(theirs)
            out[ours] = t.T if _is_conv1d(theirs) else t
    for i in range(cfg.n_layers):  # c_attn is W_q | W_k | W_v side by side, transposed
        w, b = src.pop(f"h.{i}.attn.c_attn.weight", None), src.pop(f"h.{i}.attn.c_attn.bias", None)
        if w is not None and b is not None:
            for name, wq, bq in zip(("w_q", "w_k", "w_v"), w.T.chunk(3, dim=0), b.chunk(3), strict=True):
                out[f"decoder.layers.{i}.self_attn.{name}.weight"] = wq
                out[f"decoder.layers.{i}.self_attn.{name}.bias"] = bq
    out.update({f"<gpt2> {k}": v for k, v in src.items()})  # left over: reported as unexpected
    return out


def to_hf(tensors: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    out = {theirs: tensors[ours].T if _is_conv1d(theirs) else tensors[ours] for ours, theirs in _renames(cfg).items()}
    for i in range(cfg.n_layers):
        attn = f"decoder.layers.{i}.self_attn."
        out[f"h.{i}.attn.c_attn.weight"] = torch.cat([tensors[f"{attn}{n}.weight"] for n in ("w_q", "w_k", "w_v")]).T
        out[f"h.{i}.attn.c_attn.bias"] = torch.cat([tensors[f"{attn}{n}.bias"] for n in ("w_q", "w_k", "w_v")])
    return {f"transformer.{k}" if not k.startswith(("lm_head", "score")) else k: v for k, v in out.items()}
