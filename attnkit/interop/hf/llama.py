"""Llama (``model_type: llama``: Llama, SmolLM2, TinyLlama, ...) <-> attnkit's GPT with
rotary positions, RMSNorm, SwiGLU and grouped-query attention."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from attnkit.config import ModelConfig, preset
from attnkit.interop.hf.common import lm_special_ids, special_ids_to_hf, unsupported


def config_from_hf(data: dict[str, Any]) -> ModelConfig:
    unsupported(data, {"hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "pretraining_tp": 1}, "llama")
    # transformers 5 writes rope_parameters {rope_theta, rope_type}; earlier ones rope_theta and rope_scaling.
    rope = data.get("rope_parameters") or data.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"rope scaling {rope!r} is not supported (only the default rotary positions)")
    theta = float(rope.get("rope_theta", data.get("rope_theta", 10000.0)))
    heads = data["num_attention_heads"]
    d_model = data["hidden_size"]
    head_dim = data.get("head_dim") or d_model // heads
    return preset(
        "llama-tiny",
        vocab_size=data["vocab_size"],
        d_model=d_model,
        n_heads=heads,
        n_kv_heads=data.get("num_key_value_heads") or heads,
        d_k=None if head_dim == d_model // heads else head_dim,
        n_layers=data["num_hidden_layers"],
        d_ff=data["intermediate_size"],
        max_len=data.get("max_position_embeddings", 2048),
        eps=data.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
        dropout=0.0,
        attention_dropout=float(data.get("attention_dropout", 0.0)),
        init_std=data.get("initializer_range", 0.02),
        tie_embeddings=data.get("tie_word_embeddings", False),
        **lm_special_ids(data),
    )


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    llama_shaped = (
        cfg.family == "gpt" and cfg.positional == "rotary" and cfg.norm == "rms" and cfg.norm_first and cfg.gated
        and cfg.activation == "silu" and not cfg.bias and not cfg.logits_bias
    )  # fmt: skip
    if not llama_shaped:
        raise ValueError("only Llama-shaped GPTs (rotary, RMSNorm pre-LN, SwiGLU, no biases) export to llama")
    if cfg.labels or not cfg.lm_head:
        raise ValueError(
            "a Llama-shaped GPT without a vocabulary head (a classifier) has no llama export; save it with "
            "save_pretrained (attnkit's own directory)"
        )
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads or cfg.n_heads,
        "head_dim": cfg.d_k or cfg.d_model // cfg.n_heads,
        "num_hidden_layers": cfg.n_layers,
        "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.max_len,
        "rms_norm_eps": cfg.eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "default"},
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": cfg.attention_dropout or 0.0,
        "initializer_range": cfg.init_std,
        "tie_word_embeddings": cfg.tie_embeddings,
        **special_ids_to_hf(cfg),
    }


def _renames(cfg: ModelConfig) -> dict[str, str]:
    """attnkit name -> Llama name; every tensor maps one to one, in nn.Linear's layout."""
    names = {"embeddings.token.weight": "model.embed_tokens.weight", "decoder.final_norm.gamma": "model.norm.weight"}
    for i in range(cfg.n_layers):
        ours, theirs = f"decoder.layers.{i}.", f"model.layers.{i}."
        pairs = {
            "add_norm_self.norm.gamma": "input_layernorm.weight",
            "add_norm_ffn.norm.gamma": "post_attention_layernorm.weight",
            "self_attn.w_q.weight": "self_attn.q_proj.weight",
            "self_attn.w_k.weight": "self_attn.k_proj.weight",
            "self_attn.w_v.weight": "self_attn.v_proj.weight",
            "self_attn.w_o.weight": "self_attn.o_proj.weight",
            "ffn.w_1.weight": "mlp.gate_proj.weight",
            "ffn.w_3.weight": "mlp.up_proj.weight",
            "ffn.w_2.weight": "mlp.down_proj.weight",
        }
        names.update({ours + a: theirs + b for a, b in pairs.items()})
    if not cfg.tie_embeddings:
        names["head.weight"] = "lm_head.weight"
    return names


def to_attnkit(tensors: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    src = dict(tensors)
    if cfg.tie_embeddings:
        src.pop("lm_head.weight", None)  # a tied copy of the embedding, when the file keeps one
    src = {k: v for k, v in src.items() if not k.endswith("rotary_emb.inv_freq")}  # recomputed, not weights
    out = {ours: src.pop(theirs) for ours, theirs in _renames(cfg).items() if theirs in src}
    out.update({f"<llama> {k}": v for k, v in src.items()})  # left over: reported as unexpected
    return out


def to_hf(tensors: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    return {theirs: tensors[ours] for ours, theirs in _renames(cfg).items()}
