"""The model's configuration: one frozen, validated dataclass for the four families, and
the fields each family's build function never reads (refused when set).

Every field is a variant that some family really uses; the family's build function in
:mod:`attnkit.models` reads only the fields it needs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from attnkit.config.typed import build, check_types

Family = Literal["transformer", "bert", "gpt", "t5"]
Positional = Literal["sinusoidal", "sinusoidal-halves", "learned", "relative", "rotary"]


@dataclass(frozen=True)
class ModelConfig:
    """The shape and wiring of one model. Names follow the chapter (d_model, d_ff, n_heads h,
    n_layers N)."""

    family: Family
    vocab_size: int
    d_model: int = 512
    n_heads: int = 8  # h
    d_ff: int = 2048
    n_layers: int = 6  # N: encoder layers, or the only stack's
    n_decoder_layers: int | None = None  # encoder-decoder only; None = n_layers
    d_k: int | None = None  # per-head width; None = d_model / n_heads (T5 sets it apart)
    n_kv_heads: int | None = None  # key/value heads of self-attention (grouped-query, Llama); None = n_heads
    rope_theta: float = 10000.0  # positional="rotary": θ_i = rope_theta^(-2i/d_k)
    dropout: float = 0.1  # on sub-layer outputs, embeddings and FFN hidden units
    attention_dropout: float | None = None  # on attention weights; None = dropout
    activation: Literal["relu", "gelu", "gelu_tanh", "silu"] = "relu"
    gated: bool = False  # gated FFN (T5 v1.1 GEGLU)
    norm: Literal["layer", "rms"] = "layer"
    norm_first: bool = False  # [eq:att-addnorm] post-LN; True = pre-LN (GPT-2, T5)
    eps: float = 1e-5
    bias: bool = True  # biases in the linear maps (T5 has none)
    scale_scores: bool = True  # 1/√d_k in attention (T5 folds it into its initialisation)
    positional: Positional = "sinusoidal"
    max_len: int = 1024  # learned positions: table size; elsewhere the longest input accepted
    relative_buckets: int = 32  # T5 relative bias
    relative_max_distance: int = 128
    type_vocab_size: int = 0  # BERT segment embeddings; 0 = none
    embedding_norm: bool = False  # LayerNorm after the embeddings (BERT)
    scale_embeddings: bool = False  # multiply token embeddings by √d_model (the paper, Marian)
    tie_embeddings: bool = True  # source, target and pre-softmax weights shared (the paper)
    head_scale: bool = False  # T5 v1.0: hidden state × d_model^-0.5 before the tied head
    logits_bias: bool = False  # a bias on the vocabulary logits (Marian, BERT's MLM head)
    lm_head: bool = True  # a vocabulary head (BERT: the MLM head; False = bare encoder)
    pooler: bool = False  # BERT's tanh pooler over the first token
    # A sequence-classification head (BERT): its label names, () for none. It reads the pooled
    # first token ("cls": the pooler's output, or the raw state without a pooler) or the mean of
    # the real tokens ("mean", as sentence embeddings are pooled), then dropout and a linear map.
    labels: tuple[str, ...] = ()
    classifier_pooling: Literal["cls", "mean", "last"] = "cls"
    # LoRA adapters (attnkit.nn.lora) on these attention projections, the rest frozen: rank 0 =
    # none. A saved model has them merged (a plain model again, lora_rank 0).
    lora_rank: int = 0
    lora_alpha: float | None = None  # None = lora_rank (a scale of 1)
    lora_targets: tuple[str, ...] = ("w_q", "w_v")
    init_std: float = 0.02
    pad_token_id: int = 0
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    decoder_start_token_id: int | None = None  # encoder-decoder: first decoder input

    def __post_init__(self) -> None:
        check_types(self)
        positive = ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_len")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        for name in ("n_decoder_layers", "d_k"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive or null, got {value}")
        if self.d_k is None and self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}); "
                "choose n_heads among its divisors or set d_k"
            )
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value}")
        if self.eps <= 0 or self.init_std <= 0:
            raise ValueError(f"eps ({self.eps}) and init_std ({self.init_std}) must be positive")
        if self.positional.startswith("sinusoidal") and self.d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model, got {self.d_model}")
        if self.n_kv_heads is not None and (self.n_kv_heads <= 0 or self.n_heads % self.n_kv_heads):
            raise ValueError(
                f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads}); use a divisor, or null"
            )
        if self.positional == "rotary" and ((self.d_k or self.d_model // self.n_heads) % 2 or self.rope_theta <= 0):
            raise ValueError(f"rotary positions need an even per-head width and rope_theta > 0, got {self.rope_theta}")
        if self.positional == "relative" and self.family != "t5":
            raise ValueError("positional='relative' is T5's; use 'sinusoidal' or 'learned' for " + self.family)
        if self.labels:
            if self.family not in ("bert", "gpt"):
                raise ValueError(f"labels (a classification head) are for BERT and GPT models, not {self.family}")
            if self.lm_head:
                raise ValueError("a classifier has no vocabulary head: set lm_head=False beside labels")
            if self.family == "gpt" and self.classifier_pooling == "cls":
                raise ValueError(
                    "a GPT classifier reads its last token (classifier_pooling=last) or the mean; under the causal "
                    "mask its first token sees nothing but itself"
                )
            if len(set(self.labels)) != len(self.labels) or not all(self.labels) or len(self.labels) < 2:
                raise ValueError(f"labels must be 2 or more distinct, non-empty names, got {list(self.labels)}")
        if self.lora_rank < 0 or (self.lora_alpha is not None and self.lora_alpha <= 0):
            raise ValueError(
                f"lora_rank must be >= 0 (0 = no adapters; 4 to 16 is usual) and lora_alpha > 0 or null, got "
                f"{self.lora_rank} and {self.lora_alpha}"
            )
        if self.lora_rank and not set(self.lora_targets) <= {"w_q", "w_k", "w_v", "w_o"}:
            raise ValueError(f"lora_targets must be among w_q, w_k, w_v, w_o, got {list(self.lora_targets)}")
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(f"{name} ({value}) must be in [0, vocab_size={self.vocab_size})")
        _check_used(self)

    @property
    def is_encoder_decoder(self) -> bool:
        return self.family in ("transformer", "t5")

    @property
    def decoder_layers(self) -> int:
        return self.n_layers if self.n_decoder_layers is None else self.n_decoder_layers

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with ``changes`` applied (and validated)."""
        return from_dict({**dataclasses.asdict(self), **changes})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# The fields each family's build function never reads: any value but the default would change
# nothing, which in a study is a trap, so it is refused. A field used by some families only
# (T5's relative bias, BERT's segments and pooler, the fan-in initialisation of T5 and the
# Glorot one of the Transformer, which take no init_std) is listed under the others.
UNUSED: dict[str, tuple[str, ...]] = {
    "transformer": (
        "relative_buckets", "relative_max_distance", "type_vocab_size", "embedding_norm", "head_scale", "lm_head",
        "pooler", "init_std",
    ),
    "bert": ("n_decoder_layers", "relative_buckets", "relative_max_distance", "head_scale"),
    "gpt": (
        "n_decoder_layers", "relative_buckets", "relative_max_distance", "type_vocab_size", "embedding_norm",
        "head_scale", "pooler",
    ),
    "t5": ("type_vocab_size", "embedding_norm", "scale_embeddings", "init_std", "lm_head", "pooler"),
}  # fmt: skip


def _check_used(cfg: ModelConfig) -> None:
    """Refuse a field that ``cfg``'s family does not use (:data:`UNUSED`), naming family and key."""
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    for name in UNUSED[cfg.family]:
        if getattr(cfg, name) != defaults[name]:
            raise ValueError(
                f"a {cfg.family} model does not use model.{name} (got {getattr(cfg, name)!r}: it would change "
                f"nothing); remove it, or leave it at {defaults[name]!r}"
            )
    if cfg.family == "t5" and cfg.positional != "relative":
        raise ValueError(
            f"a t5 model's positions are its relative bias: model.positional must be 'relative', got {cfg.positional!r}"
        )
    if cfg.positional != "rotary" and cfg.rope_theta != defaults["rope_theta"]:
        raise ValueError(
            f"model.rope_theta ({cfg.rope_theta}) is used by rotary positions only, and positional is "
            f"{cfg.positional!r}; remove it, or set positional='rotary'"
        )


def from_dict(data: dict[str, Any]) -> ModelConfig:
    """Build a model config from a mapping, rejecting unknown keys with a "did you mean"."""
    if isinstance(data, dict) and ("family" not in data or "vocab_size" not in data):
        raise ValueError("a model config needs at least 'family' and 'vocab_size'")
    return build(ModelConfig, data, "model")
