"""Model configuration: one frozen, validated dataclass for the four families, the named
presets, and the JSON round trip saved beside every set of weights.

Every field is a variant that some family really uses; the family's build function in
:mod:`attnkit.models` reads only the fields it needs.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")
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
    if get_origin(hint) is tuple:
        args = get_args(hint)
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_matches(v, args[0]) for v in value)
        return len(value) == len(args) and all(_matches(v, a) for v, a in zip(value, args, strict=True))
    return isinstance(value, hint)


def _describe(hint: Any) -> str:
    if hint is type(None):
        return "null"
    if get_origin(hint) is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(hint))
    if get_origin(hint) is tuple:
        args = get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_describe(args[0])}s"
        return f"a list of {len(args)} {_describe(args[0])}s"
    return "a number" if hint is float else f"a{'n' if hint is int else ''} {hint.__name__}"


def _options(hint: Any) -> tuple[Any, ...]:
    """The alternatives of a union annotation (``int | None`` -> int, NoneType)."""
    return get_args(hint) if get_origin(hint) in (Union, UnionType) else (hint,)


def _check_types(config: Any) -> None:
    """Every field holds a value of its annotated type (config files are user input)."""
    hints = get_type_hints(type(config))
    for field in dataclasses.fields(config):
        value, hint = getattr(config, field.name), hints[field.name]
        options = _options(hint)
        if not any(_matches(value, option) for option in options):
            wanted = " or ".join(_describe(option) for option in options)
            raise ValueError(f"{field.name} must be {wanted}, got {value!r}")
        numbers = value if isinstance(value, tuple) else (value,)
        if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
            raise ValueError(f"{field.name} must be a finite number, got {value!r}")


def _build(cls: type[T], data: Any, section: str) -> T:
    """``cls(**data)``, rejecting unknown keys with a "did you mean" and turning JSON lists
    into the tuples the dataclasses hold."""
    if not isinstance(data, dict):
        raise ValueError(f"the {section} config must be a mapping, got {type(data).__name__}")
    hints = get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    values = {}
    for key, value in data.items():
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown {section} config key {key!r}{hint}")
        is_tuple = any(get_origin(o) is tuple for o in _options(hints[key]))
        values[key] = tuple(value) if is_tuple and isinstance(value, list) else value
    try:
        return cls(**values)
    except TypeError as err:  # a required field is missing
        raise ValueError(f"{section} config: {err}") from None


def from_dict(data: dict[str, Any]) -> ModelConfig:
    """Build a model config from a mapping, rejecting unknown keys with a "did you mean"."""
    if isinstance(data, dict) and ("family" not in data or "vocab_size" not in data):
        raise ValueError("a model config needs at least 'family' and 'vocab_size'")
    return _build(ModelConfig, data, "model")


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
# Llama (Touvron et al. 2023): a GPT with rotary positions, RMSNorm pre-LN, SwiGLU, no biases,
# grouped-query attention.
_LLAMA = dict(
    family="gpt",
    positional="rotary",
    norm="rms",
    norm_first=True,
    activation="silu",
    gated=True,
    bias=False,
    dropout=0.0,
    eps=1e-5,
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
    "llama-tiny": {
        **_LLAMA,
        "vocab_size": 1000,
        "d_model": 64,
        "d_ff": 160,
        "n_heads": 4,
        "n_kv_heads": 2,
        "n_layers": 2,
        "max_len": 256,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    },
    # HuggingFaceTB/SmolLM2-135M: 30 layers, d 576, 9 query / 3 key-value heads, SwiGLU 1536.
    "smollm2-135m": {
        **_LLAMA,
        "vocab_size": 49152,
        "d_model": 576,
        "d_ff": 1536,
        "n_heads": 9,
        "n_kv_heads": 3,
        "n_layers": 30,
        "max_len": 8192,
        "rope_theta": 100000.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
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


Objective = Literal["translation", "causal_lm", "masked_lm", "span_corruption", "classify"]

# Each family's pretraining objective [tab:att-families] (translation: the paper's task).
OBJECTIVES: dict[str, Objective] = {
    "transformer": "translation",
    "gpt": "causal_lm",
    "bert": "masked_lm",
    "t5": "span_corruption",
}
# The families each objective trains (translation: either encoder–decoder; classify: an encoder,
# or GPT reading its last token, GPT-1's transfer).
OBJECTIVE_FAMILIES: dict[str, tuple[str, ...]] = {
    "translation": ("transformer", "t5"),
    "causal_lm": ("gpt",),
    "masked_lm": ("bert",),
    "span_corruption": ("t5",),
    "classify": ("bert", "gpt"),
}


@dataclass(frozen=True)
class TrainConfig:
    """How to train: optimiser, schedule, budget, precision, checkpoints."""

    objective: Objective | None = None  # None = the family's own
    # A model to fine-tune instead of random weights: a directory (attnkit's or Hugging Face's),
    # or a name of PRETRAINED (an installed package's model). Its architecture, weights and
    # tokenizer are the run's; the model section adds only what the task needs (labels).
    init: str | None = None
    max_steps: int = 1000  # optimiser steps
    time_budget: float | None = None  # seconds of training; stops at whichever comes first
    batch_tokens: int = 4096  # per batch; each process trains on batches_per_step per step (the paper: ~25,000)
    grad_accum: int = 1  # micro-batches per optimiser step (each of batch_tokens / grad_accum)
    # Batches of batch_tokens each process trains on per optimiser step: a step of W processes
    # trains on W * batches_per_step consecutive batches, the same at any W for the same product.
    batches_per_step: int = 1
    optimizer: Literal["adam", "adamw", "adafactor"] = "adam"  # adafactor: T5's (betas and eps are Adam's)
    lr: float = 2.0  # peak learning rate, or the Noam multiplier when schedule = "noam"
    betas: tuple[float, float] = (0.9, 0.98)  # the paper's
    eps: float = 1e-9  # the paper's
    weight_decay: float = 0.0
    # budget-linear / budget-cosine: warm-up, then decay to min_lr_ratio at the end of time_budget;
    # the horizon in steps is fixed once from the step rate measured over the warm-up
    # (training.schedule.budget_horizon) and saved with every checkpoint, so resuming follows it.
    # warmup-constant: a linear warm-up, then the peak rate to the end (constant: the peak from step 1).
    schedule: Literal["noam", "cosine", "constant", "warmup-constant", "budget-linear", "budget-cosine"] = "noam"
    warmup: int = 4000  # steps
    min_lr_ratio: float = 0.1  # cosine, budget-*: floor as a fraction of the peak
    clip_norm: float | None = 1.0  # gradient clipping; None = off
    # Steps whose loss is NaN or infinite that may be skipped (no update, counted as "skipped" in
    # the metrics) before training stops with the step number; 0 = stop at the first.
    skip_nonfinite: int = 0
    label_smoothing: float = 0.1  # translation only (the paper's ε_ls)
    # bf16/fp16: autocast (fp16 on GPU, with a scaler); auto: bf16 where the hardware computes it natively
    precision: Literal["fp32", "bf16", "fp16", "auto"] = "fp32"
    # The CPU class to act as (attnkit.machine): auto = this CPU's, or $ATTNKIT_CPU_CLASS when set; a
    # lower class (e.g. avx2 on an AVX512-BF16 CPU) takes its paths: fp32 for precision=auto, its fit.
    cpu_class: Literal["auto", "avx512-bf16", "avx512", "avx2", "x86-64", "arm64"] = "auto"
    # Presets with a wall-clock budget and a machine-fit table (attnkit.training.fit) measure each
    # candidate model's step here and train the one their study found best for the updates it affords.
    fit: bool = True
    seed: int = 0
    checkpoint_every: int = 500  # steps
    keep_checkpoints: int = 5  # the last k complete checkpoints are kept
    eval_every: int = 500  # steps; 0 = only at the end
    eval_batches: int = 20  # validation batches per evaluation
    log_every: int = 10  # steps between metric lines
    distributed: Literal["ddp", "fsdp"] = "ddp"  # under torchrun
    device: str = "auto"  # "auto", "cpu", "cuda", "cuda:1", ...
    compile: bool = False  # torch.compile the model (the first step's compile time goes to metrics.jsonl)

    def __post_init__(self) -> None:
        _check_types(self)
        for name in (
            "max_steps",
            "batch_tokens",
            "grad_accum",
            "batches_per_step",
            "checkpoint_every",
            "keep_checkpoints",
            "eval_batches",
            "log_every",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup", "eval_every", "skip_nonfinite"):
            if getattr(self, name) < 0:
                raise ValueError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        if self.schedule == "noam" and self.warmup < 1:
            raise ValueError("train.warmup must be >= 1 with the Noam schedule (it divides by warmup^1.5)")
        if self.lr <= 0 or self.eps <= 0 or self.weight_decay < 0:
            raise ValueError(f"train.lr ({self.lr}) and train.eps ({self.eps}) must be > 0, weight_decay >= 0")
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"train.betas must be in [0, 1), got {self.betas}")
        if not 0.0 <= self.label_smoothing < 1.0 or not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError("train.label_smoothing must be in [0, 1) and train.min_lr_ratio in [0, 1]")
        if self.time_budget is not None and self.time_budget <= 0:
            raise ValueError(f"train.time_budget must be > 0 seconds, got {self.time_budget}")
        if self.schedule.startswith("budget-") and self.time_budget is None:
            raise ValueError(
                f"train.schedule={self.schedule} decays to the end of the time budget, but train.time_budget is "
                "null; set --train.time_budget=SECONDS, or use --train.schedule=cosine (decays over train.max_steps)"
            )
        if self.clip_norm is not None and self.clip_norm <= 0:
            raise ValueError(f"train.clip_norm must be > 0 or null, got {self.clip_norm}")
        if self.batch_tokens < self.grad_accum:
            raise ValueError(
                f"train.batch_tokens ({self.batch_tokens}) must be >= train.grad_accum ({self.grad_accum})"
            )


@dataclass(frozen=True)
class DataConfig:
    """What to train on. ``corpus="files"``: ``path`` holds plain-text files (one document or
    sentence per line) for the language-model objectives, tab-separated source/target files for
    translation, ``text<TAB>label`` files for classification. ``"bible"``: aligned public-domain
    Bibles (see :mod:`attnkit.data.corpora`), split by whole chapters. ``"numbers"``: number
    words from num2words. ``"testament"`` and ``"books"`` (classification): which Testament, or
    which of the 66 books, a verse of ``source``'s Bible is from, split by whole chapters."""

    corpus: Literal["files", "bible", "numbers", "testament", "books"] = "files"  # files: data.path; others built in
    path: tuple[str, ...] = ()
    source: str = "4"  # bible: source translation (4 = World English); numbers: source language (num2words)
    target: str = "l"  # bible: target translation (l = Louis Segond 1910); numbers: target language
    bibles: tuple[str, ...] = ("k", "4")  # bible, language models: the translations read as plain text
    # bible, translation: text-to-text tasks trained together instead of source -> target, each
    # source prefixed with its task as T5's are (attnkit.data.corpora.TASKS), e.g. "modernize".
    tasks: tuple[str, ...] = ()
    # bible tasks: how many times each task's training pairs are read per epoch, in data.tasks'
    # order (2 = twice; 0.5 = a seeded random half of them, the same half every epoch); () = once
    # each. Held-out splits are never weighed.
    task_weights: tuple[float, ...] = ()
    numbers: int = 20000  # numbers: how many (0 .. numbers-1)
    tokenizer: str | None = None  # a tokenizer.json to use; None = train a byte-level BPE on the data
    vocab_size: int = 8000  # when training the tokenizer
    # bible: how many times the tokenizer reads each language's training text, as LANG=WEIGHT
    # (e.g. fr=3: a bigger share of the vocabulary for French); () = once each.
    tokenizer_weights: tuple[str, ...] = ()
    max_tokens: int = 128  # longer examples are truncated
    # Train on this many of the training examples (a seeded choice, in proportion to each class
    # for classification: attnkit.data.batching.few_examples); None = all. Fine-tuning with few labels.
    train_examples: int | None = None
    valid_fraction: float = 0.02  # held out for evaluation
    # A short-example curriculum: the first curriculum_epochs epochs train only on the examples
    # of at most curriculum_max_tokens padded positions (specials included); None = none.
    curriculum_max_tokens: int | None = None
    curriculum_epochs: int = 1

    def __post_init__(self) -> None:
        _check_types(self)
        if self.curriculum_max_tokens is not None and self.curriculum_max_tokens < 2:
            raise ValueError(
                f"data.curriculum_max_tokens must be >= 2 (a token and its special) or null, got "
                f"{self.curriculum_max_tokens}"
            )
        if self.curriculum_epochs < 1:
            raise ValueError(
                f"data.curriculum_epochs must be >= 1, got {self.curriculum_epochs} (no curriculum: "
                "curriculum_max_tokens=null)"
            )
        if self.vocab_size < 300 or self.max_tokens < 4:
            raise ValueError(
                f"data.vocab_size must be >= 300 (bytes + specials) and data.max_tokens >= 4, got "
                f"{self.vocab_size} and {self.max_tokens}"
            )
        if self.train_examples is not None and self.train_examples < 1:
            raise ValueError(
                f"data.train_examples must be >= 1 (or null for every training example), got {self.train_examples}"
            )
        if not 0.0 < self.valid_fraction < 0.5:
            raise ValueError(f"data.valid_fraction must be in (0, 0.5), got {self.valid_fraction}")
        if self.tasks:
            from attnkit.data.corpora import check_tasks

            if self.corpus != "bible":
                raise ValueError(
                    f"data.tasks are Bible text-to-text tasks; set data.corpus=bible (got {self.corpus!r})"
                )
            check_tasks(self.tasks)
        if self.task_weights and not self.tasks:
            raise ValueError(
                f"data.task_weights={list(self.task_weights)} weigh data.tasks, and this run has none; set "
                "data.tasks (with data.corpus=bible) or drop data.task_weights"
            )
        if self.task_weights and len(self.task_weights) != len(self.tasks):
            raise ValueError(
                f"data.task_weights={list(self.task_weights)} needs one weight per task of data.tasks "
                f"({len(self.tasks)}: {list(self.tasks)})"
            )
        if any(not w > 0 for w in self.task_weights):
            raise ValueError(
                f"data.task_weights must all be > 0, got {list(self.task_weights)}; drop a task from data.tasks instead"
            )
        if self.tokenizer_weights:
            from attnkit.data.corpora import language_weights

            if self.corpus != "bible":
                raise ValueError(
                    f"data.tokenizer_weights weigh the Bibles' languages; set data.corpus=bible (got {self.corpus!r})"
                )
            language_weights(self.tokenizer_weights)
            if self.tokenizer:
                raise ValueError(
                    f"data.tokenizer_weights shape a tokenizer attnkit trains, but data.tokenizer={self.tokenizer} "
                    "is given; drop one of them"
                )


@dataclass(frozen=True)
class RunConfig:
    """Everything a training run needs; saved as ``config.json`` in the run directory."""

    model: ModelConfig
    train: TrainConfig = TrainConfig()
    data: DataConfig = DataConfig()

    def __post_init__(self) -> None:
        if why := objective_mismatch(self.objective, self.model.family):
            raise ValueError(f"train.objective={self.objective}: {why}")
        if self.data.tokenizer_weights and self.objective != "translation":
            raise ValueError(
                f"data.tokenizer_weights weigh the languages of translation pairs, and this run's objective is "
                f"{self.objective}; drop data.tokenizer_weights"
            )
        if self.data.tokenizer_weights and self.train.init:
            raise ValueError(
                f"data.tokenizer_weights shape a tokenizer attnkit trains, but train.init={self.train.init} brings "
                "its own; drop one of them"
            )

    @property
    def objective(self) -> Objective:
        return self.train.objective or OBJECTIVES[self.model.family]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def objective_mismatch(objective: str, family: str) -> str | None:
    """None where ``objective`` trains ``family`` models; otherwise why not, and the fix."""
    families = OBJECTIVE_FAMILIES[objective]
    if family in families:
        return None
    return (
        f"the {objective} objective trains {' or '.join(families)} models, not {family}; use a {families[0]} "
        f"model, or --train.objective={OBJECTIVES[family]} ({family}'s own)"
    )


def run_from_dict(data: Any) -> RunConfig:
    if not isinstance(data, dict):
        raise ValueError(f"a run config must be a mapping, got {type(data).__name__}")
    # "machine": a run directory's record of the machine it was fitted to (attnkit.training.fit), not config.
    unknown = sorted(set(data) - {"model", "train", "data", "machine"})
    if unknown:
        close = difflib.get_close_matches(unknown[0], ["model", "train", "data"], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown run config section {unknown[0]!r}{hint} (sections: model, train, data)")
    if "model" not in data:
        raise ValueError("a run config needs a 'model' section")
    return RunConfig(
        model=from_dict(data["model"]),
        train=_build(TrainConfig, data.get("train", {}), "train"),
        data=_build(DataConfig, data.get("data", {}), "data"),
    )


# The usual optimisation of each family, for its pretraining objective.
TRAIN_DEFAULTS: dict[str, dict[str, Any]] = {
    "transformer": {},  # the paper: Adam (0.9, 0.98, 1e-9), Noam, label smoothing 0.1
    "gpt": dict(
        optimizer="adamw", lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, schedule="cosine", warmup=2000
    ),
    "bert": dict(
        optimizer="adamw", lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, schedule="cosine", warmup=10000
    ),
    # T5's own: Adafactor, each step relative to the parameter's scale (Adam's absolute steps
    # barely move T5's N(0, 1) embedding while they blow up its 1/√d_k-folded W^Q; docs/families.md).
    "t5": dict(optimizer="adafactor", lr=1e-2, schedule="cosine", warmup=1000),
}


# Runs on the built-in corpora, sized for a 2-core CPU: (model preset, model, train, data changes).
# The vocabulary size is the tokenizer's, set when the run starts.
_CPU_TRANSLATOR = dict(d_model=256, n_heads=4, d_ff=1024, n_layers=3, norm_first=True, dropout=0.0)
_CPU_LM = dict(d_model=256, n_heads=4, d_ff=1024, n_layers=4, dropout=0.1, max_len=128)
_TEN_MINUTES = dict(
    warmup=200, batch_tokens=4096, max_steps=100_000, time_budget=600.0, checkpoint_every=200, eval_every=0
)
_BIBLE_TEXT = dict(corpus="bible", bibles=("k", "4"), vocab_size=8000, max_tokens=128)  # King James + World English
_CLASSIFIER = dict(lm_head=False, pooler=False, classifier_pooling="mean", dropout=0.1)
# The classifier's fine-tuning fits its schedule to the machine: budget-cosine decays to the end
# of the time budget at the step rate this machine measures over the warm-up (or at max_steps,
# whichever comes first), where a cosine over max_steps stopped half-way on a 2-core CPU.
_FINE_TUNE = dict(
    objective="classify", init="all-MiniLM-L6-v2", lr=5e-5, warmup=30, schedule="budget-cosine", batch_tokens=4096,
    max_steps=300, time_budget=300.0, checkpoint_every=100, eval_every=0, label_smoothing=0.0,
)  # fmt: skip
RUN_PRESETS: dict[str, tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    # The main job: English -> French on the World English Bible / Louis Segond 1910 for 10
    # minutes: shared BPE and token batches as the paper, with the recipe that the study of
    # docs/translation.md found for this budget: pre-LN, no dropout and no label smoothing (2.5
    # passes over the pairs under-fit, and both slow the step), a short warm-up to a 2e-3 peak,
    # small batches (more updates, and faster per token on this CPU).
    "translate-en-fr": (
        "transformer-base",
        _CPU_TRANSLATOR,
        dict(
            lr=0.32,  # Noam x0.32: peak 2e-3 at the end of the warm-up (d_model 256, warm-up 100)
            warmup=100,
            batch_tokens=1024,
            label_smoothing=0.0,
            max_steps=100_000,
            time_budget=600.0,
            checkpoint_every=500,
            eval_every=0,
            log_every=10,
            precision="auto",
        ),
        dict(corpus="bible", source="4", target="l", vocab_size=8000, max_tokens=96),
    ),
    # A seconds-long translation task for tests and quick experiments (German reorders the units).
    "numbers-en-de": (
        "transformer-tiny",
        dict(dropout=0.0, n_layers=2),
        dict(lr=1.0, warmup=100, batch_tokens=2048, max_steps=300, checkpoint_every=100, eval_every=0, log_every=10),
        dict(corpus="numbers", source="en", target="de", numbers=5000, vocab_size=600, max_tokens=48),
    ),
    "gpt-bible": ("gpt-tiny", _CPU_LM, dict(lr=1e-3, **_TEN_MINUTES), _BIBLE_TEXT),
    "bert-bible": ("bert-tiny", _CPU_LM, dict(lr=5e-4, **_TEN_MINUTES), _BIBLE_TEXT),
    "t5-bible": (
        "t5-tiny",
        dict(d_model=256, n_heads=4, d_k=64, d_ff=1024, n_layers=3, dropout=0.1),
        dict(lr=1e-2, **_TEN_MINUTES),
        _BIBLE_TEXT,
    ),
    # BERT's understanding at work: the real all-MiniLM-L6-v2 fine-tuned to classify, on the
    # user's text<TAB>label files (minilm-classify) or on which Testament a verse is from.
    "minilm-classify": ("bert-tiny", _CLASSIFIER, _FINE_TUNE, dict(corpus="files", max_tokens=128)),
    "minilm-testament": ("bert-tiny", _CLASSIFIER, _FINE_TUNE, dict(corpus="testament", source="4", max_tokens=96)),
    # GPT's generation at work: the real SmolLM2-135M fine-tuned on the user's text with LoRA
    # adapters on its query and value projections (merged when saved). Its cosine runs over
    # max_steps, not the budget: a 2-core CPU makes ~35 of the 200 steps in 300 s, near the peak
    # rate, and the King James Psalms reached validation perplexity 33.2 so, against 42.3 with
    # budget-cosine decaying over those 35 (2026-12-02, the same machine and hour).
    "smollm2-lora": (
        "llama-tiny",
        dict(lora_rank=8, lora_alpha=16.0),
        dict(
            init="SmolLM2-135M",
            lr=5e-4,
            warmup=20,
            schedule="cosine",
            batch_tokens=2048,
            max_steps=200,
            time_budget=300.0,
            checkpoint_every=100,
            eval_every=0,
            weight_decay=0.0,
        ),
        dict(corpus="files", max_tokens=128),
    ),
    # T5's text-to-text use: one model, two tasks told apart by their prefixes, 10 minutes.
    "t5-bible-tasks": (
        "t5-tiny",
        dict(d_model=256, n_heads=4, d_k=64, d_ff=1024, n_layers=3, dropout=0.0),
        # The recipe study of docs/families.md (1,400 steps each): T5's own Adafactor, where Adam
        # under the translator's Noam x0.32 reached held-out greedy BLEU 0.6; at 3e-2 rather than
        # T5's 1e-2 (7.9 and 7.4 over two seeds), after a linear warm-up of 100 updates, then
        # constant: 29.8, 28.3, 24.4 over three seeds where a constant 3e-2 from the first update
        # gave 16.2, 18.6 and 3.0; no dropout (under 1 pass over the pairs; it was 23% of the
        # step), small batches.
        dict(
            objective="translation",
            schedule="warmup-constant",
            warmup=100,
            lr=3e-2,
            batch_tokens=1024,
            label_smoothing=0.0,
            precision="auto",
            max_steps=100_000,
            time_budget=600.0,
            checkpoint_every=500,
            eval_every=0,
        ),
        dict(corpus="bible", tasks=("translate English to French", "modernize"), vocab_size=8000, max_tokens=96),
    ),
}


def run_preset(name: str) -> RunConfig:
    """A run config: one of :data:`RUN_PRESETS`, or a model preset with the family's objective
    and usual optimisation (and data to be given)."""
    if name in RUN_PRESETS:
        base, model, train, data = RUN_PRESETS[name]
        family = PRESETS[base]["family"]
        return RunConfig(
            model=preset(base, **model),
            train=TrainConfig(**{**TRAIN_DEFAULTS[family], **train}),
            data=DataConfig(**data),
        )
    if name not in PRESETS:
        known = sorted([*PRESETS, *RUN_PRESETS])
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown preset {name!r}{hint} (known: {', '.join(known)})")
    model = preset(name)
    return RunConfig(model=model, train=TrainConfig(**TRAIN_DEFAULTS[model.family]))


def _parse_scalar(text: str, hint: Any, key: str) -> Any:
    if type(None) in _options(hint) and text.lower() in ("null", "none"):  # before str: --train.init=null unsets
        return None
    for option in _options(hint):
        if option is bool and text.lower() in ("true", "false", "1", "0", "yes", "no"):
            return text.lower() in ("true", "1", "yes")
        if option is int:
            try:
                return int(text)
            except ValueError:
                continue
        if option is float:
            try:
                return float(text)
            except ValueError:
                continue
        if get_origin(option) is tuple:
            args = get_args(option)
            items = [t for t in text.split(",") if t] if text else []
            element = args[0]
            return tuple(_parse_scalar(t.strip(), element, key) for t in items)
        if option is str or (get_origin(option) is Literal and text in get_args(option)):
            return text
    wanted = " or ".join(_describe(o) for o in _options(hint))
    raise ValueError(f"--{key}={text}: expected {wanted}")


def apply_overrides(run: RunConfig, overrides: dict[str, str]) -> RunConfig:
    """Apply typed ``section.key=value`` overrides (strings from the command line), each
    checked against the field's type, with a "did you mean" on unknown keys."""
    data = run.to_dict()
    sections = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig}
    all_keys = [f"{s}.{f.name}" for s, cls in sections.items() for f in dataclasses.fields(cls)]
    for key, text in overrides.items():
        section, _, name = key.partition(".")
        if section not in sections or name not in {f.name for f in dataclasses.fields(sections[section])}:
            same_name = [k for k in all_keys if k.endswith(f".{name}")]  # right key, wrong section
            close = same_name or difflib.get_close_matches(key, all_keys, n=1)
            hint = f"; did you mean --{close[0]}?" if close else ""
            raise ValueError(f"unknown option --{key}{hint}")
        data[section][name] = _parse_scalar(text, get_type_hints(sections[section])[name], key)
    return run_from_dict(data)


def load_run_config(path: str | Path) -> RunConfig:
    """A run config from a JSON or YAML file."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"config file {path} is a directory; pass a JSON or YAML file")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"config file {path} not found") from None
    except UnicodeDecodeError as err:
        raise ValueError(
            f"config file {path} is not valid UTF-8 (byte 0x{err.object[err.start]:02x} at offset {err.start}); "
            "save it as UTF-8"
        ) from None
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ModuleNotFoundError("reading YAML needs PyYAML: pip install 'attnkit[yaml]'", name="yaml") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ValueError(f"{path} is not valid YAML: {err}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not valid JSON: {err}") from None
    try:
        return run_from_dict(data)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
