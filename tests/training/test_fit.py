"""A recipe that fits the machine: the choice is a pure function of the measured step times and
the budget, a fitted run saves it and a resumed run keeps it, explicit options win, and the
committed tables validate against their presets and studies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import attnkit
from attnkit.cli import main
from attnkit.config import RUN_PRESETS, apply_overrides, run_preset
from attnkit.models.run_dir import latest_checkpoint
from attnkit.training import run as run_module
from attnkit.training.fit import FIT_TABLES, Candidate, FitTable, choose, fit_for, measure

ROOT = Path(__file__).resolve().parents[2]

SMALL = Candidate("small", {"model.d_model": "32", "model.d_ff": "64"}, {1000: 8.0, 2000: 11.0, 4000: 12.0})
LARGE = Candidate("large", {}, {1000: 6.0, 2000: 10.5, 4000: 16.0})
TABLE = FitTable("some-preset", "recipe-fit-test.json", (SMALL, LARGE))


def test_score_interpolates_in_log_updates_and_holds_flat_outside_the_study() -> None:
    assert SMALL.score(1000) == 8.0 and SMALL.score(4000) == 12.0
    assert SMALL.score(2**0.5 * 1000) == pytest.approx(9.5)  # halfway in log(updates)
    assert SMALL.score(500) == 8.0 and SMALL.score(10**6) == 12.0


def test_the_choice_is_a_pure_function_of_step_times_and_budget() -> None:
    # Here the small model takes 1,500 updates (score 9.8), the large one 1,000 (6.0): small wins.
    slow = {"small": 0.4, "large": 0.6}
    choice = choose(TABLE, slow, budget=600)
    assert choice.chosen == "small" and choice.updates == {"small": 1500, "large": 1000}
    assert choice.changes == SMALL.changes and choice == choose(TABLE, dict(slow), budget=600)
    # Four times faster: 6,000 against 4,000 updates, the large model's curve is ahead (16 vs 12).
    assert choose(TABLE, {k: v / 4 for k, v in slow.items()}, budget=600).chosen == "large"
    # Equal predictions go to the larger model.
    even = FitTable("p", "s", (Candidate("a", {}, {10: 1.0}), Candidate("b", {}, {10: 1.0})))
    assert choose(even, {"a": 1.0, "b": 1.0}, budget=100).chosen == "b"


def test_a_budget_too_short_for_the_smallest_model_is_refused_with_the_budget_that_would_do() -> None:
    with pytest.raises(ValueError) as refused:
        choose(TABLE, {"small": 0.4, "large": 0.6}, budget=100)
    message = str(refused.value)
    assert "train.time_budget=100 s affords 250 updates of the fastest model" in message
    assert "fewer than the 1,000 its study starts at; give --train.time_budget=400 or more" in message
    assert "--train.fit=false" in message


def test_a_candidate_short_of_its_studys_first_budget_is_not_chosen() -> None:
    # The large model would make 900 updates: below its study's first budget its score is a guess
    # (held at its 1,000-update score, 6.0, over the small model's 5.0), so the small one is chosen.
    table = FitTable("p", "s", (Candidate("small", {}, {1000: 5.0}), Candidate("large", {}, {1000: 6.0})))
    choice = choose(table, {"small": 0.5, "large": 1.0}, budget=900)
    assert choice.chosen == "small" and choice.updates == {"small": 1800, "large": 900}


def test_max_steps_caps_the_updates_each_candidate_is_scored_at() -> None:
    # 600 s would give the large model 4,000 updates (16.0), but max_steps stops both at 1,200.
    choice = choose(TABLE, {"small": 0.1, "large": 0.15}, budget=600, max_steps=1200)
    assert choice.updates == {"small": 1200, "large": 1200} and choice.chosen == "small"
    refused = r"train.max_steps=999 is fewer than the 1,000 updates .*--train.max_steps=1000"
    with pytest.raises(ValueError, match=refused):
        choose(TABLE, {"small": 0.1, "large": 0.15}, budget=600, max_steps=999)


def test_measure_times_each_candidate_on_the_clock_it_is_given() -> None:
    now = [0.0]
    cost = {"small": 0.25, "large": 1.0}  # seconds a typical step takes on the fake clock

    def step_of(candidate: Candidate):
        sizes = iter([1.0, 1.0, 0.5, 1.5, 1.0, 1.0, 1.0])  # two warm-up steps, then five of known size

        def one() -> float:
            size = next(sizes)
            now[0] += cost[candidate.name] * size
            return size

        return one

    seconds = measure(TABLE.candidates, step_of, steps=5, warm=2, clock=lambda: now[0])
    assert seconds == pytest.approx(cost)


def test_explicit_options_win_and_turn_the_fit_off(tiny_table: FitTable) -> None:
    table = tiny_table
    assert fit_for(table.preset, [], True, 600.0) == (table, "")
    key = sorted(table.keys)[0]
    off, why = fit_for(table.preset, [key, "train.seed"], True, 600.0)
    assert off is None and why == f"explicit --{key} (explicit options win)"
    # Any model option: the study scored its candidates' models, not one with another depth.
    deeper = fit_for(table.preset, ["model.n_layers"], True, 600.0)
    assert deeper == (None, "explicit --model.n_layers (explicit options win)")
    assert fit_for(table.preset, ["train.lr", "train.max_steps"], True, 600.0) == (table, "")
    assert fit_for(table.preset, [], False, 600.0) == (None, "train.fit=false")
    assert fit_for(table.preset, [], True, None) == (None, "no time budget to fit")
    assert fit_for("gpt-tiny", [], True, 600.0) == (None, "")


@pytest.mark.parametrize("name", sorted(FIT_TABLES))
def test_every_table_validates_against_its_preset_and_its_study(name: str) -> None:
    table = FIT_TABLES[name]
    assert table.preset == name and name in RUN_PRESETS
    preset = run_preset(name)
    assert preset.train.time_budget is not None, "a fit table belongs to a preset with a wall-clock budget"
    study = json.loads((ROOT / "benchmarks" / "results" / table.study).read_text())
    rows = {(r["variant"], r["steps"]): max(r["bleu_greedy"], r["bleu_beam4"]) for r in study["runs"]}
    sizes = []
    for candidate in table.candidates:
        # A candidate changes the model and its schedule, never the data the tokenizer is trained on.
        assert all(k.startswith(("model.", "train.", "data.curriculum_")) for k in candidate.changes), candidate
        run = apply_overrides(preset, candidate.changes)  # each option is a real, valid one
        sizes.append(attnkit.build_model(run.model.replace(vocab_size=1000)).num_parameters())
        for updates, score in candidate.scores.items():
            assert rows[(candidate.name, updates)] == pytest.approx(score, abs=0.005), (candidate.name, updates)
    assert sizes == sorted(sizes), "candidates go from the smallest model to the largest"


# -- a fitted run, end to end, on a seconds-long task ------------------------------------------

FAST = ["--data.vocab_size=400", "--train.batch_tokens=512", "--train.warmup=5", "--train.log_every=1",
        "--train.checkpoint_every=4", "--train.max_steps=10", "--train.time_budget=100000", "--quiet"]  # fmt: skip


@pytest.fixture
def tiny_table(monkeypatch: pytest.MonkeyPatch) -> FitTable:
    """A table for transformer-tiny: the narrow model wins any budget of fewer than ~10k updates."""
    table = FitTable(
        "transformer-tiny",
        "none",
        (
            Candidate("narrow", {"model.d_model": "32", "model.d_ff": "64", "model.n_heads": "2"}, {5: 9.0}),
            Candidate("as is", {}, {5: 1.0, 10**9: 10.0}),
        ),
    )
    monkeypatch.setitem(FIT_TABLES, "transformer-tiny", table)
    return table


def record(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())["machine"]


def test_a_fitted_run_on_the_forced_avx2_path_saves_its_choices_and_resumes_bit_identical(
    tmp_path: Path, pairs: Path, tiny_table: FitTable, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("ATTNKIT_CPU_CLASS", "avx2")
    base = ["train", "--preset", "transformer-tiny", "--data.path", str(pairs), "--train.precision=auto", *FAST]
    assert main([*base, "--out", str(tmp_path / "straight")]) == 0
    out = capsys.readouterr().out
    assert "machine: AVX2 without native bf16" in out and ": fp32 (train.precision=auto" in out
    assert "machine fit: narrow:" in out
    saved = record(tmp_path / "straight")
    assert saved["cpu_class"] == "avx2" and saved["forced_by"] == "ATTNKIT_CPU_CLASS" and saved["precision"] == "fp32"
    assert saved["fit"]["chosen"] == "narrow" and set(saved["fit"]["step_seconds"]) == {"narrow", "as is"}
    assert json.loads((tmp_path / "straight" / "run.json").read_text())["model"]["d_model"] == 32
    assert main(["info", str(tmp_path / "straight")]) == 0
    info = capsys.readouterr().out
    assert "d_model 32" in info and "  machine: AVX2 without native bf16" in info and "  machine fit: narrow" in info
    # Interrupted after 6 steps, then resumed by naming the preset again: no new probe, the same model.
    assert main([*base, "--out", str(tmp_path / "resumed"), "--session-steps", "6"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(run_module, "choose", lambda *a: pytest.fail("a resumed run measured again"))
    assert main([*base, "--out", str(tmp_path / "resumed"), "--resume"]) == 0
    assert "resumed: the run keeps the choices it made on avx2: fp32, narrow" in capsys.readouterr().out
    assert latest_checkpoint(tmp_path / "resumed").name == "step-00000010"
    a, b = attnkit.from_pretrained(tmp_path / "straight"), attnkit.from_pretrained(tmp_path / "resumed")
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


def test_a_run_resumed_before_its_first_checkpoint_keeps_its_record(
    tmp_path: Path, pairs: Path, tiny_table: FitTable, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    base = ["train", "--preset", "transformer-tiny", "--data.path", str(pairs), *FAST, "--out", str(tmp_path / "r")]
    assert main(base) == 0
    first = record(tmp_path / "r")
    shutil.rmtree(tmp_path / "r" / "checkpoints")  # as if killed before its first checkpoint
    (tmp_path / "r" / "metrics.jsonl").unlink()
    monkeypatch.setattr(run_module, "choose", lambda *a: pytest.fail("a resumed run measured again"))
    assert main([*base, "--resume"]) == 0
    assert record(tmp_path / "r") == first and "machine fit: narrow:" in capsys.readouterr().out
    assert json.loads((tmp_path / "r" / "run.json").read_text())["model"]["d_model"] == 32


def test_the_probe_times_a_step_of_batches_per_step_batches(
    tmp_path: Path, pairs: Path, tiny_table: FitTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = []
    step = run_module.Trainer.step

    def counted(self, batches):  # every step trained, the probe's included
        sizes.append(len(batches))
        return step(self, batches)

    monkeypatch.setattr(run_module.Trainer, "step", counted)
    argv = ["train", "--preset", "transformer-tiny", "--data.path", str(pairs), *FAST, "--train.batches_per_step=2"]
    assert main([*argv, "--out", str(tmp_path / "r")]) == 0
    assert record(tmp_path / "r")["fit"] is not None and len(sizes) > 10 and set(sizes) == {2}


def test_explicit_model_options_are_trained_as_given(
    tmp_path: Path, pairs: Path, tiny_table: FitTable, capsys: pytest.CaptureFixture
) -> None:
    argv = ["train", "--preset", "transformer-tiny", "--data.path", str(pairs), "--model.d_model=64", *FAST]
    assert main([*argv, "--out", str(tmp_path / "r")]) == 0
    assert "machine fit: off: explicit --model.d_model (explicit options win)" in capsys.readouterr().out
    saved = json.loads((tmp_path / "r" / "run.json").read_text())
    assert saved["model"]["d_model"] == 64 and saved["machine"]["fit"] is None


@pytest.mark.parametrize(
    ("env", "options", "message"),
    [
        ("avx3", [], "ATTNKIT_CPU_CLASS=avx3 is not a CPU class; use auto or one of"),
        (None, ["--train.cpu_class=avx3"], "--train.cpu_class=avx3: expected one of"),
        (None, ["--train.precision=fp8"], "--train.precision=fp8: expected one of"),
        (None, ["--train.time_budget=0.01"], "train.time_budget=0.01 s affords 0 updates of the fastest model"),
        (None, ["--train.time_budget=0.01", "--resume"], "train.time_budget=0.01 s affords 0 updates"),
    ],
)
def test_bad_machine_options_are_one_line_exit_2_and_write_nothing(
    tmp_path: Path,
    pairs: Path,
    tiny_table: FitTable,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    env: str | None,
    options: list[str],
    message: str,
) -> None:
    if env is not None:
        monkeypatch.setenv("ATTNKIT_CPU_CLASS", env)
    argv = ["train", "--preset", "transformer-tiny", "--data.path", str(pairs), *FAST, *options]
    assert main([*argv, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "r").exists()


def test_a_class_above_the_cpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnkit import machine

    monkeypatch.setattr(machine, "detected_cpu_class", lambda: "avx2")
    with pytest.raises(ValueError, match=r"it is avx2, and a class can only be lowered .* one of avx2, x86-64"):
        machine.cpu_class("avx512-bf16")
    assert machine.cpu_class("x86-64").forced_by == "train.cpu_class"
    assert machine.cpu_class("avx2") == machine.CpuClass("avx2", "avx2")  # the CPU's own: nothing forced
