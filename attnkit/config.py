"""Model configuration: one frozen, validated dataclass for the four families, the named
presets, and the JSON round trip saved beside every set of weights.

Every field is a variant that some family really uses; the family's build function in
:mod:`attnkit.models` reads only the fields it needs.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from dataclasses import dataclass
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

Family = Literal["transformer", "bert", "gpt", "t5"]
Positional = Literal["sinusoidal", "sinusoidal-halves", "learned", "relative"]


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
    init_std: float = 0.02
    pad_token_id: int = 0
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    decoder_start_token_id: int | None = None  # encoder-decoder: first decoder input

    def __post_init__(self) -> None:
        _check_types(self)
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
        if self.positional == "relative" and self.family != "t5":
            raise ValueError("positional='relative' is T5's; use 'sinusoidal' or 'learned' for " + self.family)
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(f"{name} ({value}) must be in [0, vocab_size={self.vocab_size})")

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


def _matches(value: Any, hint: Any) -> bool:
    if hint is type(None):
        return value is None
    if get_origin(hint) is Literal:
        return not isinstance(value, bool) and value in get_args(hint)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, hint)


def _describe(hint: Any) -> str:
    if hint is type(None):
        return "null"
    if get_origin(hint) is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(hint))
    return "a number" if hint is float else f"a{'n' if hint is int else ''} {hint.__name__}"


def _check_types(config: ModelConfig) -> None:
    """Every field holds a value of its annotated type (config.json is user input)."""
    hints = get_type_hints(type(config))
    for field in dataclasses.fields(config):
        value, hint = getattr(config, field.name), hints[field.name]
        options = get_args(hint) if get_origin(hint) in (Union, UnionType) else (hint,)
        if not any(_matches(value, option) for option in options):
            wanted = " or ".join(_describe(option) for option in options)
            raise ValueError(f"{field.name} must be {wanted}, got {value!r}")


def from_dict(data: dict[str, Any]) -> ModelConfig:
    """Build a config from a mapping, rejecting unknown keys with a "did you mean"."""
    if not isinstance(data, dict):
        raise ValueError(f"a model config must be a JSON object, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown model config key {key!r}{hint}")
    if "family" not in data or "vocab_size" not in data:
        raise ValueError("a model config needs at least 'family' and 'vocab_size'")
    return ModelConfig(**data)


def to_json(config: ModelConfig) -> str:
    return json.dumps(config.to_dict(), indent=2, sort_keys=True)


def from_json(text: str) -> ModelConfig:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"model config is not valid JSON: {err}") from None
    return from_dict(data)


_TRANSFORMER = dict(
    family="transformer",
    positional="sinusoidal",
    scale_embeddings=True,
    tie_embeddings=True,
    norm_first=False,
    activation="relu",
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    decoder_start_token_id=1,
)
_BERT = dict(
    family="bert",
    positional="learned",
    max_len=512,
    type_vocab_size=2,
    embedding_norm=True,
    activation="gelu",
    eps=1e-12,
    logits_bias=True,
    pooler=True,
    pad_token_id=0,
)
_GPT = dict(
    family="gpt",
    positional="learned",
    norm_first=True,
    activation="gelu_tanh",
    bos_token_id=50256,
    eos_token_id=50256,
    pad_token_id=50256,
)
_T5 = dict(
    family="t5",
    positional="relative",
    norm="rms",
    norm_first=True,
    eps=1e-6,
    bias=False,
    scale_scores=False,
    max_len=512,
    pad_token_id=0,
    eos_token_id=1,
    decoder_start_token_id=0,
)

# Sizes from the papers: Vaswani et al. 2017 Table 3 (base, big), Devlin et al. 2019 (BERT-base),
# Radford et al. 2019 / the released GPT-2 checkpoints, Raffel et al. 2020 (T5-small).
PRESETS: dict[str, dict[str, Any]] = {
    "transformer-base": {**_TRANSFORMER, "vocab_size": 37000},
    "transformer-big": {
        **_TRANSFORMER,
        "vocab_size": 37000,
        "d_model": 1024,
        "d_ff": 4096,
        "n_heads": 16,
        "dropout": 0.3,
    },
    "transformer-tiny": {**_TRANSFORMER, "vocab_size": 1000, "d_model": 64, "d_ff": 256, "n_heads": 4, "n_layers": 2},
    "bert-base": {**_BERT, "vocab_size": 30522, "d_model": 768, "d_ff": 3072, "n_heads": 12, "n_layers": 12},
    "bert-tiny": {**_BERT, "vocab_size": 1000, "d_model": 64, "d_ff": 256, "n_heads": 4, "n_layers": 2},
    "gpt2": {**_GPT, "vocab_size": 50257, "d_model": 768, "d_ff": 3072, "n_heads": 12, "n_layers": 12},
    "gpt2-medium": {**_GPT, "vocab_size": 50257, "d_model": 1024, "d_ff": 4096, "n_heads": 16, "n_layers": 24},
    "gpt-tiny": {
        **_GPT,
        "vocab_size": 1000,
        "d_model": 64,
        "d_ff": 256,
        "n_heads": 4,
        "n_layers": 2,
        "max_len": 256,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 0,
    },
    "t5-small": {**_T5, "vocab_size": 32128, "d_model": 512, "d_ff": 2048, "n_heads": 8, "d_k": 64, "head_scale": True},
    "t5-tiny": {
        **_T5,
        "vocab_size": 1000,
        "d_model": 64,
        "d_ff": 128,
        "n_heads": 4,
        "d_k": 16,
        "n_layers": 2,
        "activation": "gelu_tanh",
        "gated": True,
        "tie_embeddings": False,
    },
}


def preset(name: str, **changes: Any) -> ModelConfig:
    """The named preset's config, with ``changes`` applied."""
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown preset {name!r}{hint} (known: {', '.join(sorted(PRESETS))})")
    return from_dict({**PRESETS[name], **changes})
