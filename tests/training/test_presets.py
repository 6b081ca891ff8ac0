"""The run presets: each validates, builds and survives the JSON round trip of run.json, and
the demo's is the recipe docs/translation.md arrived at."""

from __future__ import annotations

import json

import pytest

from attnkit.config import RUN_PRESETS, apply_overrides, run_from_dict, run_preset
from attnkit.models import build_model
from attnkit.training.schedule import learning_rate


@pytest.mark.parametrize("name", sorted(RUN_PRESETS))
def test_run_presets_validate_build_and_round_trip(name: str) -> None:
    run = run_preset(name)
    model = build_model(run.model.replace(vocab_size=500))  # the tokenizer sets the vocabulary at run time
    assert sum(p.numel() for p in model.parameters()) > 0
    assert run_from_dict(json.loads(json.dumps(run.to_dict()))) == run


def test_the_demo_preset_is_the_recipe_of_the_study() -> None:
    run = run_preset("translate-en-fr")
    train, model = run.train, run.model
    assert train.time_budget == 600.0 and train.schedule == "noam" and train.warmup == 100
    assert train.lr * model.d_model**-0.5 * train.warmup**-0.5 == pytest.approx(2e-3)  # the peak
    assert model.norm_first and model.dropout == 0.0 and train.label_smoothing == 0.0
    assert train.precision == "auto" and train.device == "auto"  # bf16 where native; a GPU when there is one


@pytest.mark.parametrize("name", ["minilm-classify", "minilm-testament"])
def test_the_classifier_presets_fit_their_schedule_to_the_budget(name: str) -> None:
    """A pretrained model's size is given: what fits the machine is the schedule, which decays
    to the end of the time budget at the step rate measured over the warm-up, capped at max_steps."""
    train = run_preset(name).train
    assert train.schedule == "budget-cosine" and train.time_budget is not None and train.max_steps < 10_000


def test_null_on_the_command_line_unsets_an_optional_text_option() -> None:
    # --train.init=null trains the MiniLM preset's task from random weights ("null" is not a path).
    assert run_preset("minilm-testament").train.init == "all-MiniLM-L6-v2"
    assert apply_overrides(run_preset("minilm-testament"), {"train.init": "null"}).train.init is None
    assert apply_overrides(run_preset("minilm-testament"), {"train.init": "runs/null-hypothesis"}).train.init == (
        "runs/null-hypothesis"
    )


def test_the_t5_tasks_preset_is_the_recipe_of_its_study() -> None:
    # docs/families.md: Adam on T5's folded W^Q stayed at BLEU 0.6; T5's own Adafactor learns, at 3e-2 twice as
    # well as at T5's 1e-2, and after a warm-up of 100 updates on every seed screened.
    run = run_preset("t5-bible-tasks")
    assert (run.train.optimizer, run.train.schedule, run.train.lr, run.train.warmup) == (
        "adafactor", "warmup-constant", 3e-2, 100
    )  # fmt: skip
    rates = [learning_rate(step, run.train, run.model.d_model) for step in (1, 50, 100, 101, 100_000)]
    assert rates == pytest.approx([3e-4, 1.5e-2, 3e-2, 3e-2, 3e-2])  # up over 100 updates, then constant
    assert run.model.dropout == 0.0 and not run.model.scale_scores  # T5's parametrisation, exchangeable with HF
    assert run.train.precision == "auto" and run.train.time_budget == 600.0 and run.train.batch_tokens == 1024
