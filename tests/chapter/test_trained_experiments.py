"""The chapter experiments that train models: the heads of a translator [eq:att-head], pre-LN
versus post-LN [eq:att-addnorm] and the three families [tab:att-families]. Each runs once in
quick mode; the tests read its figures and measured numbers, and check the measures themselves
on attention whose answer is known."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from attnkit import from_pretrained
from attnkit.chapter import families, heads, prenorm, transfer
from attnkit.chapter.report import Context, Section

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def heads_section(sections: dict[str, Section]) -> Section:
    return sections["heads"]


@pytest.fixture(scope="module")
def prenorm_section(sections: dict[str, Section]) -> Section:
    return sections["prenorm"]


@pytest.fixture(scope="module")
def families_section(sections: dict[str, Section]) -> Section:
    return sections["families"]


def check_section(section: Section, out: Path) -> None:
    """PNG figures on disk, numbers that survive JSON, labels in the text's citations."""
    assert section.figures
    for name in section.figures:
        assert (out / name).read_bytes()[:8] == PNG, name
    assert json.loads(json.dumps(section.numbers)) == section.numbers
    assert section.markdown().startswith(f"## {section.title}")


# -- heads ------------------------------------------------------------------------------


def test_heads_cover_every_layer_and_head_with_bounded_measures(heads_section: Section, out: Path) -> None:
    check_section(heads_section, out)
    numbers = heads_section.numbers
    assert numbers["trained_steps"] == heads.STEPS[True]
    config = from_pretrained(out / "heads-translator").config
    expected = {
        (kind, layer, head)
        for kind, layers in (("encoder-self", config.n_layers), ("decoder-self", config.decoder_layers),
                             ("cross", config.decoder_layers))
        for layer in range(1, layers + 1)
        for head in range(1, config.n_heads + 1)
    }  # fmt: skip
    found = [(h["kind"], h["layer"], h["head"]) for h in numbers["heads"]]
    assert sorted(found) == sorted(expected)
    longest = 48  # numbers-en-de's data.max_tokens: no sequence is longer
    for h in numbers["heads"]:
        assert 0.0 <= h["distance"] <= longest
        assert 0.0 <= h["entropy"] <= math.log(longest) + 1e-6
        assert all(0.0 <= h[k] <= 1.0 + 1e-6 for k in heads.NAMES)
        assert h["prev"] + h["same"] + h["next"] <= 1.0 + 1e-5
        assert h["class"] == heads.classify(h)
        if h["kind"] == "decoder-self":  # the causal mask [eq:att-mask]: nothing reaches a later token
            assert h["next"] < 1e-6
    for kind, uniform in numbers["uniform"].items():
        assert uniform["entropy"] > 0 and uniform["distance"] > 0, kind
    assert f"{len(numbers['heads'])} heads" in heads_section.text


def test_heads_alignments_are_distributions_over_the_source(heads_section: Section) -> None:
    alignments = heads_section.numbers["alignments"]
    assert len(alignments) == heads.ALIGNED
    for a in alignments:
        weights = torch.tensor(a["weights"])  # (T, S)
        assert weights.shape == (len(a["target"]), len(a["source"]))
        assert torch.allclose(weights.sum(-1), torch.ones(len(a["target"])), atol=1e-5)
        assert a["source"][-1] == "</s>"


def test_heads_of_a_given_run_directory_measure_the_same_model(heads_section: Section, out: Path) -> None:
    again = heads.run(Context(out=out / "again", quick=True, model=str(out / "heads-translator")))
    assert again.numbers["trained_steps"] == heads.STEPS[True]  # read from the run's checkpoint, not retrained
    assert "heads-translator" in again.numbers["model"]
    for first, second in zip(heads_section.numbers["heads"], again.numbers["heads"], strict=True):
        assert first == pytest.approx(second, abs=1e-5)


def test_head_statistics_name_known_patterns() -> None:
    """Previous-token attention (one sentence of 5 tokens, the first token attending to itself)
    and uniform attention, measured exactly."""
    T = 5
    prev = torch.zeros(1, 1, T, T)
    prev[0, 0, 0, 0] = 1.0
    for i in range(1, T):
        prev[0, 0, i, i - 1] = 1.0
    mask = torch.ones(1, T, dtype=torch.bool)
    uniform = torch.full((1, 1, T, T), 1.0 / T)
    measured, baseline = heads.head_statistics([{"encoder-self": ([prev, uniform], mask, mask)}])
    first, second = measured
    assert first["distance"] == pytest.approx((T - 1) / T)
    assert first["prev"] == pytest.approx((T - 1) / T) and first["entropy"] == pytest.approx(0.0, abs=1e-6)
    assert first["class"] == "previous-token"
    assert second["entropy"] == pytest.approx(math.log(T))
    assert second["distance"] == pytest.approx(sum(abs(i - j) for i in range(T) for j in range(T)) / T**2)
    assert second["class"] == "broad"
    assert baseline["encoder-self"] == pytest.approx({k: v for k, v in second.items() if k in baseline["encoder-self"]})


def test_head_statistics_ignore_padding() -> None:
    """A padded sentence measures as the same sentence unpadded."""
    weights = torch.softmax(torch.randn(1, 2, 3, 3, generator=torch.Generator().manual_seed(0)), -1)
    padded = torch.zeros(1, 2, 5, 5)
    padded[..., :3, :3] = weights
    padded[..., 3:, 0] = 1.0  # what pad queries attend to must not count
    short = torch.ones(1, 3, dtype=torch.bool)
    long = torch.tensor([[True, True, True, False, False]])
    a, _ = heads.head_statistics([{"cross": ([weights], short, short)}])
    b, _ = heads.head_statistics([{"cross": ([padded], long, long)}])
    for x, y in zip(a, b, strict=True):
        assert x == pytest.approx(y)


# -- pre-LN versus post-LN --------------------------------------------------------------


def test_prenorm_has_twelve_runs_with_finite_or_flagged_losses(prenorm_section: Section, out: Path) -> None:
    check_section(prenorm_section, out)
    numbers = prenorm_section.numbers
    keys = {f"{n}-{s}-{d}" for n in ("post", "pre") for s in ("nowarmup", "warmup") for d in (6, 12, 24)}
    assert set(numbers["final_loss"]) == set(numbers["status"]) == set(numbers["curves"]) == keys
    unigram = numbers["unigram_loss"]
    assert 0.0 < unigram < math.log(1000)  # below uniform over the 1000-token vocabulary
    for key in keys:
        loss, state, curve = numbers["final_loss"][key], numbers["status"][key], numbers["curves"][key]
        if state == "diverged":
            assert loss is None and len(curve) < numbers["steps"]
            continue
        assert math.isfinite(loss) and len(curve) == numbers["steps"]
        assert state == ("stalled" if loss >= unigram - prenorm.STALL else "trained")
        assert curve[0] > curve[-1], key  # every run starts at about ln(vocab) and learns something
    assert f"{unigram:.2f} nats" in prenorm_section.text


def test_prenorm_runs_differ_only_where_they_should(prenorm_section: Section) -> None:
    """Same seed, weights and batches: the two schedules of one model share the loss of their
    first step (warm-up changes the update, not the starting point), and part after it."""
    curves = prenorm_section.numbers["curves"]
    for norm in ("post", "pre"):
        for depth in (6, 12, 24):
            assert curves[f"{norm}-warmup-{depth}"][0] == curves[f"{norm}-nowarmup-{depth}"][0]
            assert curves[f"{norm}-warmup-{depth}"][1] != curves[f"{norm}-nowarmup-{depth}"][1]


# -- families ---------------------------------------------------------------------------


def test_every_family_learns_under_its_own_objective(families_section: Section, out: Path) -> None:
    check_section(families_section, out)
    found = families_section.numbers["families"]
    assert set(found) == {"BERT", "GPT", "T5"}
    objectives = {"BERT": "masked_lm", "GPT": "causal_lm", "T5": "span_corruption"}
    for name, f in found.items():
        assert f["objective"] == objectives[name]
        assert f["steps"] == families.BUDGET[True]["train.max_steps"]
        assert f["final_loss"] < f["first_loss"], name
        assert f["perplexity"] == pytest.approx(math.exp(f["held_out_loss"]))
        assert 0.0 <= f[families.ACCURACY[f["objective"]]] <= 1.0
        assert f["parameters"] > 0
        row = f"| {name} | {f['architecture']} |"
        assert row in families_section.text


# -- transfer ---------------------------------------------------------------------------


def test_pretraining_then_fine_tuning_is_compared_at_equal_total(sections: dict[str, Section], out: Path) -> None:
    section = sections["transfer"]
    check_section(section, out)
    numbers = section.numbers
    assert numbers["unit"] == "optimiser steps"
    bert, t5 = numbers["bert"], numbers["t5"]
    # The steps each own arm took, counted by its runs: equal totals, the pretrained arms' split by SHARE
    total, first = transfer.TOTAL[True], round(transfer.TOTAL[True] * transfer.SHARE)
    for tuned, alone in ((bert["masked-LM pretrained, then fine-tuned"], bert["random initialisation"]),
                         (t5["span-corruption pretrained, then the tasks"], t5["the tasks alone"])):  # fmt: skip
        assert (tuned["pretraining_steps"], tuned["steps"]) == (first, total - first)
        assert (alone["pretraining_steps"], alone["steps"]) == (0, total)
        # Targets, counted by the trainer: at least one an update; pretraining's beside the pretrained arm's
        assert tuned["pretraining_tokens"] >= first and alone["pretraining_tokens"] == 0
        assert tuned["tokens"] >= total - first and alone["tokens"] >= total
    assert {"masked-LM pretrained, then fine-tuned", "random initialisation"} <= set(bert)
    assert set(t5) == {"span-corruption pretrained, then the tasks", "the tasks alone"}
    for arms in (bert, t5):
        for name, arm in arms.items():
            pretrained = name.startswith(("masked-LM", "span-corruption"))
            assert (arm["pretraining_seconds"] > 0) == pretrained, name
            assert (arm["pretraining_loss"] is not None) == pretrained, name
            assert arm["seconds"] >= arm["pretraining_seconds"] and math.isfinite(arm["valid_loss"])
            assert arm["steps"] >= 1
            assert f"| {name} |" in section.text
    for arm in bert.values():
        assert 0.0 <= arm["macro_f1"] <= 1.0 and 0.0 <= arm["accuracy"] <= 1.0 and arm["verses"] > 0
    for arm in t5.values():
        assert set(arm["tasks"]) == {"modernize"}  # quick mode: one task
        scores = arm["tasks"]["modernize"]
        assert scores["sentences"] == transfer.SCORED[True] and 0.0 <= scores["bleu"] <= 100.0
        assert scores["copy_bleu"] > 20.0  # King James against World English: mostly the same words
