"""BERT (``model_type: bert``) <-> attnkit's BERT.

Two checkpoint layouts are read and written: ``BertModel`` (bare keys, tanh pooler, no MLM
head; attnkit ``lm_head=False, pooler=True``) and ``BertForMaskedLM`` (keys under ``bert.``,
the MLM head under ``cls.predictions``, no pooler; ``lm_head=True, pooler=False``). Which
parts a checkpoint has is read from its tensors (:func:`config_from_tensors`), falling back
on ``architectures``. ``BertForPreTraining`` files (both parts, as the original
``bert-base-uncased``) load too; their next-sentence classifier ``cls.seq_relationship``,
which attnkit has no module for, is dropped. ``BertForSequenceClassification`` (``bert.``
keys, the pooler, ``classifier.*`` at the top level) is attnkit's BERT with ``labels``, named
by the checkpoint's ``id2label``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attnkit.config import ModelConfig, preset
from attnkit.interop.hf.common import label_names, labels_to_hf, token_id, unsupported
from attnkit.models import build_model

# Hugging Face activations with an attnkit equivalent (gelu_fast is the tanh form too).
_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
_EXPORT_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}

# Non-parameter buffers some checkpoints keep, and the pretraining-only next-sentence head.
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
_DROPPED = ("cls.seq_relationship.weight", "cls.seq_relationship.bias")

_MLM = "BertForMaskedLM"
_CLASSIFIER = "BertForSequenceClassification"
# Keys outside the ``bert.`` prefix in a file: the MLM head's and the classifier's.
_TOP = ("cls.", "classifier.")


def config_from_hf(data: dict[str, Any]) -> ModelConfig:

    fixed = {"position_embedding_type": "absolute", "is_decoder": False, "add_cross_attention": False}
    unsupported(data, fixed, "bert")
    act = data.get("hidden_act", "gelu")
    if act not in _ACTIVATIONS:
        raise ValueError(f"hidden_act {act!r} is not supported (one of {sorted(_ACTIVATIONS)})")
    architectures = data.get("architectures") or []
    return preset(
        "bert-base",
        vocab_size=data["vocab_size"],
        d_model=data["hidden_size"],
        n_heads=data["num_attention_heads"],
        n_layers=data["num_hidden_layers"],
        d_ff=data["intermediate_size"],
        activation=_ACTIVATIONS[act],
        max_len=data.get("max_position_embeddings", 512),
        type_vocab_size=data.get("type_vocab_size", 2),
        eps=data.get("layer_norm_eps", 1e-12),
        dropout=data.get("hidden_dropout_prob", 0.1),
        attention_dropout=data.get("attention_probs_dropout_prob", 0.1),
        init_std=data.get("initializer_range", 0.02),
        tie_embeddings=data.get("tie_word_embeddings", True),
        pad_token_id=token_id(data, "pad_token_id") or 0,
        bos_token_id=token_id(data, "bos_token_id"),
        eos_token_id=token_id(data, "eos_token_id"),
        # Refined from the tensors by config_from_tensors; these are the architectures' defaults.
        lm_head=any(a in (_MLM, "BertForPreTraining") for a in architectures),
        pooler=_MLM not in architectures,
        labels=label_names(data) if _CLASSIFIER in architectures else (),
    )


def config_from_tensors(cfg: ModelConfig, tensors: dict[str, Tensor]) -> ModelConfig:
    """The parts the checkpoint really holds: an MLM head iff it has ``cls.predictions.*``,
    a pooler iff it has ``pooler.dense.*``, a classifier iff it has ``classifier.weight``
    (whatever ``architectures`` says; its label count from the weight when the config has
    no names for them)."""
    keys = {k.removeprefix("bert.") for k in tensors}
    lm_head = any(k.startswith("cls.predictions.") for k in keys)
    pooler = any(k.startswith("pooler.dense.") for k in keys)
    labels: tuple[str, ...] = ()
    if "classifier.weight" in tensors:
        count = tensors["classifier.weight"].shape[0]
        labels = cfg.labels if len(cfg.labels) == count else tuple(f"LABEL_{i}" for i in range(count))
    return cfg.replace(lm_head=lm_head, pooler=pooler, labels=labels)


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    if (
        cfg.family != "bert"
        or cfg.positional != "learned"
        or cfg.norm_first
        or cfg.norm != "layer"
        or not cfg.embedding_norm
        or cfg.scale_embeddings
        or cfg.head_scale
    ):
        raise ValueError(
            "only BERT-shaped models (learned positions, post-LN LayerNorm, normed unscaled embeddings) export to bert"
        )
    if (
        cfg.activation not in _EXPORT_ACTIVATIONS
        or cfg.gated
        or not cfg.bias
        or not cfg.scale_scores
        or cfg.d_k not in (None, cfg.d_model // cfg.n_heads)
    ):
        raise ValueError("this BERT's FFN or attention has no bert equivalent (activation, gated, bias, scale or d_k)")
    classifier = {}
    if cfg.labels:
        if cfg.classifier_pooling != "cls" or not cfg.pooler:
            raise ValueError(
                "BertForSequenceClassification reads the pooler's output; this classifier pools by "
                f"{cfg.classifier_pooling!r}{'' if cfg.pooler else ' without a pooler'} and has no bert equivalent"
            )
        classifier = labels_to_hf(cfg.labels)
    architecture = _CLASSIFIER if cfg.labels else _MLM if cfg.lm_head else "BertModel"
    return classifier | {
        "model_type": "bert",
        "architectures": [architecture],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_attention_heads": cfg.n_heads,
        "num_hidden_layers": cfg.n_layers,
        "intermediate_size": cfg.d_ff,
        "hidden_act": _EXPORT_ACTIVATIONS[cfg.activation],
        "max_position_embeddings": cfg.max_len,
        "type_vocab_size": max(cfg.type_vocab_size, 1),  # no segments: one all-zero segment row
        "layer_norm_eps": cfg.eps,
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.dropout if cfg.attention_dropout is None else cfg.attention_dropout,
        "initializer_range": cfg.init_std,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": cfg.tie_embeddings,
        "pad_token_id": cfg.pad_token_id,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
    }


def _linear(names: dict[str, str], ours: str, theirs: str) -> None:
    names[f"{ours}.weight"], names[f"{ours}.bias"] = f"{theirs}.weight", f"{theirs}.bias"


def _norm(names: dict[str, str], ours: str, theirs: str) -> None:
    names[f"{ours}.gamma"], names[f"{ours}.beta"] = f"{theirs}.weight", f"{theirs}.bias"


def _renames(cfg: ModelConfig) -> dict[str, str]:
    """attnkit name -> BertModel name (``cls.*`` for the MLM head), all one to one."""
    names = {"embeddings.token.weight": "embeddings.word_embeddings.weight"}
    if cfg.positional == "learned":
        names["embeddings.positions.weight"] = "embeddings.position_embeddings.weight"
    if cfg.type_vocab_size:
        names["embeddings.segments.weight"] = "embeddings.token_type_embeddings.weight"
    _norm(names, "embeddings.norm", "embeddings.LayerNorm")
    for i in range(cfg.n_layers):
        ours, theirs = f"encoder.layers.{i}.", f"encoder.layer.{i}."
        for a, b in (
            ("self_attn.w_q", "attention.self.query"),
            ("self_attn.w_k", "attention.self.key"),
            ("self_attn.w_v", "attention.self.value"),
            ("self_attn.w_o", "attention.output.dense"),
            ("ffn.w_1", "intermediate.dense"),
            ("ffn.w_2", "output.dense"),
        ):
            _linear(names, ours + a, theirs + b)
        _norm(names, ours + "add_norm_self.norm", theirs + "attention.output.LayerNorm")
        _norm(names, ours + "add_norm_ffn.norm", theirs + "output.LayerNorm")
    if cfg.pooler:
        _linear(names, "pooler.0", "pooler.dense")
    if cfg.labels:
        _linear(names, "classifier.1", "classifier")
    if cfg.lm_head:
        _linear(names, "head.transform.0", "cls.predictions.transform.dense")
        _norm(names, "head.transform.2", "cls.predictions.transform.LayerNorm")
        if cfg.logits_bias:
            names["head.bias"] = "cls.predictions.bias"
        if not cfg.tie_embeddings:
            names["head.weight"] = "cls.predictions.decoder.weight"
    return names


def _expected_shapes(cfg: ModelConfig) -> dict[str, torch.Size]:
    """attnkit's parameter shapes for ``cfg``, from a model built on the meta device (no memory)."""
    with torch.device("meta"):
        return {k: p.shape for k, p in build_model(cfg).named_parameters()}


def _hf_keys(tensors: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, str]]:
    """BertModel-relative keys (``bert.`` dropped, TF-era ``LayerNorm.gamma/beta`` renamed;
    buffers and the next-sentence head left out), and each one's name in the file."""
    out, names = {}, {}
    for name, t in tensors.items():
        key = name.removeprefix("bert.")
        if key.endswith((".LayerNorm.gamma", ".LayerNorm.beta")):
            key = key.rsplit(".", 1)[0] + (".weight" if key.endswith("gamma") else ".bias")
        if key not in _BUFFERS and key not in _DROPPED:
            out[key], names[key] = t, name
    # The logits' bias: decoder.bias is the one BERT's forward adds; cls.predictions.bias is the
    # same tensor when the head is tied, and an unused copy in untied checkpoints.
    bias = out.pop("cls.predictions.decoder.bias", None)
    if bias is not None:
        out["cls.predictions.bias"] = bias
        names["cls.predictions.bias"] = "cls.predictions.decoder.bias"
    return out, names


def to_attnkit(tensors: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """Rename, having checked every key and shape: a ``ValueError`` names each missing,
    misshapen or unexpected tensor by its name in the checkpoint."""
    src, names = _hf_keys(tensors)
    if cfg.lm_head and cfg.tie_embeddings:
        src.pop("cls.predictions.decoder.weight", None)  # a tied copy of the word embeddings
    prefix = "bert." if any(k.startswith("bert.") for k in tensors) else ""
    shapes = _expected_shapes(cfg)
    out: dict[str, Tensor] = {}
    missing, misshapen = [], []
    for ours, theirs in _renames(cfg).items():
        if theirs not in src:
            missing.append(theirs if theirs.startswith(_TOP) else prefix + theirs)
            continue
        t = out[ours] = src.pop(theirs)
        if t.shape != shapes[ours]:
            wanted = tuple(shapes[ours])
            misshapen.append(f"{names[theirs]}: shape {tuple(t.shape)} in the file, {wanted} in the config")
    problems = []
    if missing:
        problems.append(f"missing keys: {', '.join(missing)}")
    if src:
        problems.append(f"unexpected keys: {', '.join(sorted(names[k] for k in src))}")
    problems += misshapen
    if problems:
        raise ValueError("bert checkpoint does not match its config.json: " + "; ".join(problems))
    return out


def to_hf(tensors: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """attnkit parameters -> a ``BertModel`` file, or a ``BertForMaskedLM`` one (``bert.``
    prefix) when the model has the MLM head. The decoder weight is left out when tied, as BERT
    saves it. A model with both an MLM head and a pooler (attnkit's BERT presets) is written as
    ``BertForMaskedLM`` with the pooler kept under ``bert.pooler``: ``BertModel`` reads that
    file with the MLM head unused, ``BertForMaskedLM`` with the pooler unused."""
    out = {theirs: tensors[ours] for ours, theirs in _renames(cfg).items()}
    if not cfg.type_vocab_size:
        out["embeddings.token_type_embeddings.weight"] = tensors["embeddings.token.weight"].new_zeros(1, cfg.d_model)
    if cfg.labels:  # BertForSequenceClassification: the encoder under bert., its classifier beside it
        return {k if k.startswith(_TOP) else f"bert.{k}": v for k, v in out.items()}
    if not cfg.lm_head:
        return out
    if not cfg.logits_bias:
        out["cls.predictions.bias"] = tensors["embeddings.token.weight"].new_zeros(cfg.vocab_size)
    if not cfg.tie_embeddings:  # untied, BERT's decoder keeps its own bias (the one its forward adds)
        out["cls.predictions.decoder.bias"] = out["cls.predictions.bias"]
    return {k if k.startswith(_TOP) else f"bert.{k}": v for k, v in out.items()}
