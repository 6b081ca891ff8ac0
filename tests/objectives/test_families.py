"""Each objective on the family of [tab:att-families] it trains: a finite loss with gradients,
the right token count, refusal of the wrong family, and a tiny model learning a tiny task."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from attnkit.data.specials import Specials
from attnkit.models import Model
from attnkit.objectives import CausalLM, MaskedLM, Objective, SpanCorruption, Translation

TEXTS = [[40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50], [51, 52, 53], [54] * 25]
PAIRS = [([40, 41, 42], [50, 51]), ([43], [52, 53, 54, 55, 56])]
PRESET = {
    "translation": "transformer-tiny",
    "causal_lm": "gpt-tiny",
    "masked_lm": "bert-tiny",
    "span_corruption": "t5-tiny",
}


def objective(name: str, specials: Specials) -> Objective[Any]:
    return {
        "translation": Translation(specials),
        "causal_lm": CausalLM(specials),
        "masked_lm": MaskedLM(specials),
        "span_corruption": SpanCorruption(specials),
    }[name]


def expected_tokens(name: str, specials: Specials) -> int:
    """Target tokens of the examples: each objective's own count."""
    if name == "translation":
        return sum(len(t) + 1 for _, t in PAIRS)  # target + eos
    if name == "causal_lm":
        return sum(len(x) + 1 for x in TEXTS)  # x + eos
    if name == "masked_lm":
        return sum(max(1, round(0.15 * len(x))) for x in TEXTS)  # the chosen positions
    counts = [SpanCorruption(specials).counts(len(x)) for x in TEXTS]
    return sum(n_noise + n_spans + 2 for n_noise, n_spans in counts)  # noise, its sentinels, closing one, eos


@pytest.mark.parametrize("name", sorted(PRESET))
def test_each_objective_runs_on_its_family(name: str, specials: Specials, tiny_model: Callable[..., Model]) -> None:
    task, model = objective(name, specials), tiny_model(PRESET[name])
    batch = task.batch(PAIRS if name == "translation" else TEXTS, torch.Generator().manual_seed(0))
    out = task.loss(model, batch)
    assert out.total.dim() == 0 and torch.isfinite(out.total)
    assert out.tokens == expected_tokens(name, specials)
    assert 0 <= out.metrics["correct"] <= out.tokens
    out.total.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize(
    ("name", "wrong"), [("causal_lm", "bert-tiny"), ("masked_lm", "gpt-tiny"), ("translation", "gpt-tiny")]
)
def test_an_objective_refuses_the_wrong_family(
    name: str, wrong: str, specials: Specials, tiny_model: Callable[..., Model]
) -> None:
    task = objective(name, specials)
    batch = task.batch(PAIRS if name == "translation" else TEXTS, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=f"the {name} objective trains a"):
        task.loss(tiny_model(wrong), batch)


def test_decoder_start_must_be_bos(specials: Specials, tiny_model: Callable[..., Model]) -> None:
    task = SpanCorruption(specials)
    batch = task.batch(TEXTS, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="build the model with decoder_start_token_id=1"):
        task.loss(tiny_model("t5-tiny", decoder_start_token_id=0), batch)


# Tiny tasks, each learnable from scratch in a few seconds of CPU.
ORDINARY = list(range(37, 64))
PATTERNS = [[ORDINARY[i], ORDINARY[i + 5], ORDINARY[i + 11]] for i in range(4)]


def patterns(g: torch.Generator, n: int, repeats: int) -> list[list[int]]:
    """Texts that repeat one of four 3-token patterns: after the first token, all is determined."""
    return [PATTERNS[int(i)] * repeats for i in torch.randint(len(PATTERNS), (n,), generator=g)]


def reversals(g: torch.Generator, n: int) -> list[tuple[list[int], list[int]]]:
    """3-digit strings (10 ids) and their reversal."""
    digits = torch.tensor(ORDINARY[:10])[torch.randint(10, (n, 3), generator=g)].tolist()
    return [(d, d[::-1]) for d in digits]


TASKS: dict[str, tuple[Callable[[torch.Generator, int], list[Any]], int, float, dict[str, int]]] = {
    # name: (examples, Adam steps, ceiling on the held-out loss per token in nats, preset changes).
    # Floor for causal LM: the first token is one of 4 (log 4 over the 13 targets ≈ 0.11).
    "causal_lm": (lambda g, n: patterns(g, n, repeats=4), 60, 0.3, {}),
    "masked_lm": (lambda g, n: patterns(g, n, repeats=4), 60, 0.3, {}),
    "span_corruption": (lambda g, n: patterns(g, n, repeats=7), 30, 0.3, {}),
    # One layer each side: the post-LN stack learns reversal in half the CPU time of two.
    "translation": (reversals, 120, 0.5, {"n_layers": 1}),
}


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny models gain nothing from intra-op threads and lose much when the CPUs are shared
    (about 1 s a task on one thread, over 10 s on two busy ones)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("name", sorted(TASKS))
def test_a_tiny_model_learns_a_tiny_task(name: str, specials: Specials, tiny_model: Callable[..., Model]) -> None:
    examples, steps, ceiling, changes = TASKS[name]
    task, model = objective(name, specials), tiny_model(PRESET[name], dropout=0.0, **changes)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        out = task.loss(model, task.batch(examples(g, 16), g))
        optimizer.zero_grad()
        (out.total / out.tokens).backward()
        optimizer.step()
    model.eval()
    held_out = torch.Generator().manual_seed(1)
    with torch.no_grad():
        out = task.loss(model, task.batch(examples(held_out, 64), held_out))
    # Unsmoothed NLL: translation's label smoothing keeps its training loss above ~0.7 nats.
    assert out.metrics["nll"] / out.tokens < ceiling
