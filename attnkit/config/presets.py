"""Named starting points: the model presets (:data:`PRESETS`, sized as the papers), each
family's usual optimisation (:data:`TRAIN_DEFAULTS`) and the run presets (:data:`RUN_PRESETS`,
whole runs on the built-in corpora sized for a 2-core CPU)."""

from __future__ import annotations

import difflib
from typing import Any

from attnkit.config.model import ModelConfig, from_dict
from attnkit.config.run import DataConfig, RunConfig, TrainConfig

# Each family's wiring as its papers have it; the presets below add the sizes.
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
    # max_steps, not the budget: a 2-core CPU makes 35-60 of the 200 steps in 300 s, all near the
    # peak rate, which did better than decaying over the budget (docs/families.md).
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
