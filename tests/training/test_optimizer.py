"""The optimisers ``train.optimizer`` names, checked against the property each is chosen for."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit.config import apply_overrides, run_preset
from attnkit.training.trainer import make_optimizer


def _relative_steps(optimizer: str, lr: float) -> dict[str, float]:
    """RMS(Δθ) / RMS(θ) after one step on a random loss, for T5's embedding (drawn N(0, 1)) and
    a query matrix (drawn N(0, (d_model·d_k)^-0.5), 1/√d_k folded in)."""
    run = apply_overrides(run_preset("t5-bible-tasks"), {"train.optimizer": optimizer, "train.lr": str(lr)})
    torch.manual_seed(0)
    model = attnkit.build_model(run.model.replace(vocab_size=500))
    names = {"embedding": "embeddings.token.weight", "query": "encoder.layers.0.self_attn.w_q.weight"}
    params = dict(model.named_parameters())
    before = {k: params[n].detach().clone() for k, n in names.items()}
    x = torch.randint(3, 500, (4, 12))
    out = model(input_ids=x, decoder_input_ids=x)
    torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), torch.randint(3, 500, (48,))).backward()
    step = make_optimizer(model, run)
    step.step()
    rows = {"embedding": x.unique(), "query": slice(None)}  # the embedding's rows that had a gradient
    rms = lambda t: float(t.pow(2).mean().sqrt())  # noqa: E731
    return {k: rms((params[n].detach() - before[k])[rows[k]]) / rms(before[k][rows[k]]) for k, n in names.items()}


def test_adafactor_moves_every_matrix_by_the_same_fraction_of_itself() -> None:
    # T5's optimiser: the step is max(1e-3, RMS(θ)) × lr, its direction clipped to RMS <= 1.
    steps = _relative_steps("adafactor", 1e-2)
    for name, fraction in steps.items():
        assert 0.3e-2 <= fraction <= 1.1e-2, (name, fraction)
    assert steps["embedding"] == pytest.approx(steps["query"], rel=0.5)
    # Adam moves every weight by about lr whatever its scale: ~lr/RMS(θ) of itself, so T5's
    # N(0, 1) embedding moves ~128x less than its query matrix (RMS 1/128 at d_model 256, d_k 64).
    adam = _relative_steps("adam", 1e-3)
    assert adam["query"] > 50 * adam["embedding"], adam
