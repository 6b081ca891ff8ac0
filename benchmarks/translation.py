"""BLEU at equal wall time: attnkit's translator vs a ``transformers`` MarianMT of the same
size, trained on the same Bible pairs, tokenizer, batches, precision and budget with the same
plain loop and the ``translate-en-fr`` preset's recipe (Adam (0.9, 0.98, 1e-9), its schedule,
label smoothing and dropout; Marian is post-LN whatever the preset says), scored by sacreBLEU
(greedy) on the same held-out verses at regular intervals of training time — the
BLEU-vs-minutes curve. A budget schedule fixes each side's horizon from that side's own step
rate, as the trainer does.
The two train in one process, a step each in turn, each on its own clock, so that a busy
machine slows both alike.

``python -m benchmarks translation [--small | --budget SECONDS]``; ``--small`` trains each for 60 s.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from attnkit.config import run_preset
from attnkit.data.batching import TokenBatches
from attnkit.data.prepare import cost
from attnkit.data.tokenizer import decode
from attnkit.models import build_model
from attnkit.objectives.base import label_smoothed_nll
from attnkit.objectives.translation import Translation
from attnkit.training.distributed import native_bf16
from attnkit.training.evaluate import translate_ids
from attnkit.training.schedule import budget_horizon, horizon_probe, learning_rate
from benchmarks.common import race_on

SENTENCES = 200


def _marian(cfg: Any) -> torch.nn.Module:
    import transformers

    config = transformers.MarianConfig(
        vocab_size=cfg.vocab_size, decoder_vocab_size=cfg.vocab_size, d_model=cfg.d_model,
        encoder_layers=cfg.n_layers, decoder_layers=cfg.n_layers, encoder_attention_heads=cfg.n_heads,
        decoder_attention_heads=cfg.n_heads, encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
        # attnkit drops out sub-layer outputs, attention weights and the FFN's hidden units at
        # `dropout`: the same three here, so that both do the same work and regularisation.
        activation_function="relu", dropout=cfg.dropout, attention_dropout=cfg.dropout, activation_dropout=cfg.dropout,
        scale_embedding=True, max_position_embeddings=256, pad_token_id=cfg.pad_token_id,
        eos_token_id=cfg.eos_token_id, decoder_start_token_id=cfg.decoder_start_token_id,
        forced_eos_token_id=cfg.eos_token_id,
    )  # fmt: skip
    return transformers.MarianMTModel(config)


def _bleu(hypotheses: list[str], references: list[str]) -> float:
    import sacrebleu

    return sacrebleu.corpus_bleu(hypotheses, [references]).score


class _Side:
    """One contestant: its model, optimizer and own clock of training seconds."""

    def __init__(self, name: str, model: torch.nn.Module, data: Any, run: Any) -> None:
        self.name, self.model, self.data, self.run = name, model, data, run
        self.objective = Translation(data.specials, label_smoothing=run.train.label_smoothing)
        self.batches = iter(TokenBatches([cost(e) for e in data.train], run.train.batch_tokens, run.train.seed))
        self.optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
        self.trained, self.steps = 0.0, 0
        self.horizon: int | None = None  # a budget schedule's, fixed from this side's own clock
        self.seconds_at: dict[int, float] = {}
        self.sources = [s for s, _ in data.valid[:SENTENCES]]
        self.references = [decode(data.tokenizer, t) for _, t in data.valid[:SENTENCES]]
        self.curve: list[tuple[float, float]] = []

    def step(self) -> None:
        start = time.perf_counter()
        self.steps += 1
        run = self.run
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.steps, run.train, run.model.d_model, self.horizon)
        examples = [self.data.train[i] for i in next(self.batches)]
        batch = self.objective.batch(examples, torch.Generator().manual_seed(self.steps))
        self.model.train()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=native_bf16(torch.device("cpu"))):
            logits = self.model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                decoder_input_ids=batch["decoder_input_ids"], decoder_attention_mask=batch["decoder_attention_mask"],
            ).logits  # fmt: skip
        total, tokens = label_smoothed_nll(logits, batch["labels"], run.train.label_smoothing)
        self.optimizer.zero_grad(set_to_none=True)
        (total / tokens).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.trained += time.perf_counter() - start
        if run.train.schedule.startswith("budget-") and self.horizon is None:
            self.seconds_at[self.steps] = self.trained
            if self.steps == horizon_probe(run.train):
                self.horizon = budget_horizon(run.train, self.seconds_at)

    @property
    def at_horizon(self) -> bool:
        """A budget schedule's decay has ended: further steps would not move the weights."""
        return self.horizon is not None and self.steps >= self.horizon

    def score(self) -> None:
        """Greedy BLEU on the first ``SENTENCES`` validation verses (not counted as training time)."""
        self.model.eval()
        hypotheses = [decode(self.data.tokenizer, ids) for ids in _translate(self.model, self.sources, self.run)]
        self.curve.append((self.trained / 60, _bleu(hypotheses, self.references)))
        print(f"{self.name}: step {self.steps}, {self.trained / 60:.1f} min, BLEU {self.curve[-1][1]:.2f}", flush=True)


@torch.no_grad()
def _translate(model: torch.nn.Module, sources: list[list[int]], run: Any) -> list[list[int]]:
    if hasattr(model, "config") and hasattr(model.config, "family"):
        return translate_ids(model, sources)
    eos, pad = run.model.eos_token_id, run.model.pad_token_id
    out = []
    for i in range(0, len(sources), 32):
        chunk = [[*s, eos] for s in sources[i : i + 32]]
        width = max(map(len, chunk))
        ids = torch.tensor([s + [pad] * (width - len(s)) for s in chunk])
        generated = model.generate(ids, attention_mask=(ids != pad).long(), num_beams=1, do_sample=False,
                                   max_new_tokens=width + 50)  # fmt: skip
        for row in generated[:, 1:].tolist():
            out.append(row[: row.index(eos)] if eos in row else row)
    return out


def run(small: bool = False, points: int = 5, budget: float | None = None) -> dict[str, list[tuple[float, float]]]:
    """Both curves; ``budget`` seconds each (default: the preset's 10 minutes, or 60 s when small)."""
    config = run_preset("translate-en-fr")
    budget = budget or (60.0 if small else config.train.time_budget)
    sides = race_on(config, {"attnkit": build_model, "transformers MarianMT": _marian}, _Side, budget, points)
    return {side.name: side.curve for side in sides}
