"""Held-out perplexity at equal wall time: attnkit's GPT (the ``gpt-bible`` preset's model) vs a
``transformers`` GPT-2 of the same size, trained on the same King James and World English
verses, tokenizer, batches, precision and budget with the same plain loop and the preset's
recipe (AdamW (0.9, 0.95), weight decay on the matrices, its warm-up and cosine, dropout in the
same three places), scored on the same held-out batches at regular intervals of training time;
at the end, each one's greedy continuation of a few prompts. The two train in one process, a
step each in turn, each on its own clock (:func:`benchmarks.common.race`), so that a busy
machine slows both alike.

``python -m benchmarks lm [--small | --budget SECONDS]``; ``--small`` trains each for 30 s on a
tiny model.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.nn.functional as F

import attnkit.generation  # noqa: F401  gives attnkit's models their generate() (Model.decoding)
from attnkit.config import RunConfig, apply_overrides, run_preset
from attnkit.data.batching import TokenBatches
from attnkit.data.prepare import Data, cost
from attnkit.data.tokenizer import decode
from attnkit.models import build_model
from attnkit.objectives.base import IGNORE_INDEX
from attnkit.objectives.causal_lm import CausalLM
from attnkit.training.schedule import learning_rate
from attnkit.training.trainer import make_optimizer
from benchmarks.common import race_on

PROMPTS = ("In the beginning", "The LORD is my shepherd", "And Jesus said unto them")
HELD_OUT_BATCHES = 20
SMALL = {"model.d_model": "64", "model.n_heads": "4", "model.d_ff": "256", "model.n_layers": "2",
         "data.vocab_size": "1000", "data.bibles": "4", "train.warmup": "20"}  # fmt: skip


def _gpt2(cfg: Any) -> torch.nn.Module:
    """``transformers``' GPT2LMHeadModel of ``cfg``'s size and dropout, drawn as GPT-2 draws
    itself (as attnkit's GPT is: N(0, 0.02), residual projections / √(2N))."""
    import transformers

    config = transformers.GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.max_len, n_embd=cfg.d_model, n_layer=cfg.n_layers,
        n_head=cfg.n_heads, n_inner=cfg.d_ff, activation_function="gelu_new", resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout, layer_norm_epsilon=cfg.eps, initializer_range=cfg.init_std,
        bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


class _Side:
    """One contestant: its model, optimiser and own clock of training seconds."""

    def __init__(self, name: str, model: torch.nn.Module, data: Data, run: RunConfig) -> None:
        self.name, self.model, self.data, self.run = name, model, data, run
        self.objective = CausalLM(data.specials)
        self.batches = iter(TokenBatches([cost(e) for e in data.train], run.train.batch_tokens, run.train.seed))
        self.optimizer = make_optimizer(model, run)  # the trainer's: AdamW, decay on matrices only
        self.trained, self.steps = 0.0, 0
        held_out = TokenBatches([cost(e) for e in data.valid], run.train.batch_tokens, 0, shuffle=False)
        first = held_out.epoch_batches(0)[:HELD_OUT_BATCHES]
        self.held_out = [self.objective.batch([data.valid[i] for i in b]) for b in first]
        self.curve: list[tuple[float, float]] = []

    at_horizon = False  # a cosine over max_steps: every step moves the weights

    def _nll(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        labels = batch["labels"]
        total = F.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        return total, int((labels != IGNORE_INDEX).sum())

    def step(self) -> None:
        start = time.perf_counter()
        self.steps += 1
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.steps, self.run.train, self.run.model.d_model)
        batch = self.objective.batch([self.data.train[i] for i in next(self.batches)])
        self.model.train()
        total, tokens = self._nll(batch)
        self.optimizer.zero_grad(set_to_none=True)
        (total / tokens).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.run.train.clip_norm or math.inf)
        self.optimizer.step()
        self.trained += time.perf_counter() - start

    @torch.no_grad()
    def score(self) -> None:
        """Perplexity over the held-out batches (not counted as training time)."""
        self.model.eval()
        sums = [self._nll(batch) for batch in self.held_out]
        perplexity = math.exp(sum(float(t) for t, _ in sums) / sum(n for _, n in sums))
        self.curve.append((self.trained / 60, perplexity))
        print(f"{self.name}: step {self.steps}, {self.trained / 60:.1f} min, perplexity {perplexity:.1f}", flush=True)

    @torch.no_grad()
    def samples(self, max_new_tokens: int = 24) -> dict[str, str]:
        """Greedy continuations of :data:`PROMPTS`."""
        self.model.eval()
        tokenizer, out = self.data.tokenizer, {}
        for prompt in PROMPTS:
            ids = torch.tensor([[self.data.specials.bos, *tokenizer.encode(prompt).ids]])
            generated = self.model.generate(  # attnkit's or transformers' own, as the side is
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                eos_token_id=self.data.specials.eos, pad_token_id=self.data.specials.pad,
            )  # fmt: skip
            out[prompt] = decode(tokenizer, generated[0, 1:].tolist())
        return out


def run(small: bool = False, points: int = 5, budget: float | None = None) -> dict[str, Any]:
    """Both curves and samples; ``budget`` seconds each (default: the preset's 10 minutes, or
    30 s on a tiny model when small)."""
    config = run_preset("gpt-bible")
    if small:
        config = apply_overrides(config, SMALL)
    budget = budget or (30.0 if small else config.train.time_budget)
    sides = race_on(config, {"attnkit": build_model, "transformers GPT-2": _gpt2}, _Side, budget, points)
    return {
        "curves": {side.name: side.curve for side in sides},
        "steps": {side.name: side.steps for side in sides},
        "samples": {side.name: side.samples() for side in sides},
        "model": {k: getattr(sides[0].run.model, k) for k in ("d_model", "n_layers", "n_heads", "d_ff", "vocab_size")},
    }
