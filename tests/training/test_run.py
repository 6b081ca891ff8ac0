"""Training runs: exact resume, crash-safe checkpoints, the run directory, the CLI."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import attnkit
from attnkit.cli import main
from attnkit.config import apply_overrides, run_preset
from attnkit.models.run_dir import (
    MARKER,
    checkpoint_dir,
    checkpoint_step,
    complete_checkpoints,
    latest_checkpoint,
)
from attnkit.training.run import train

TINY = {
    "data.vocab_size": "400",
    "train.batch_tokens": "1024",
    "train.warmup": "5",
    "train.lr": "3e-3",
    "train.eval_every": "0",
    "train.log_every": "1",
    "model.dropout": "0.1",  # dropout on: resuming must replay the same masks
}


def tiny_run(corpus: Path, preset: str = "gpt-tiny", **changes: str):
    return apply_overrides(run_preset(preset), {**TINY, "data.path": str(corpus), **changes})


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(latest_checkpoint(run_dir) / "model.safetensors")


def train_losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r["split"] == "train"]


@pytest.mark.parametrize(
    ("preset", "optimizer"), [("gpt-tiny", "adamw"), ("gpt-tiny", "adafactor"), ("bert-tiny", "adamw")]
)
def test_exact_resume_mid_epoch_with_dropout_and_accumulation(
    tmp_path: Path, corpus: Path, preset: str, optimizer: str
) -> None:
    # Adafactor (T5's) keeps other state than Adam's: factored second moments, its own step count.
    # BERT's pooler gets no gradient from the masked LM, so AdamW keeps no state for it.
    steps = {"train.max_steps": "12", "train.checkpoint_every": "5", "train.grad_accum": "2"}
    run = tiny_run(corpus, preset, **steps, **{"train.optimizer": optimizer})
    train(run, tmp_path / "straight", progress_bar=False)
    train(run, tmp_path / "resumed", progress_bar=False, session_steps=7)  # stops at 7, mid-epoch
    assert latest_checkpoint(tmp_path / "resumed").name == "step-00000007"
    train(run, tmp_path / "resumed", resume=True, progress_bar=False)  # a fresh Trainer, as a new process would
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "resumed")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert train_losses(tmp_path / "straight") == train_losses(tmp_path / "resumed")


def test_interrupted_checkpoint_is_never_resumed(tmp_path: Path, corpus: Path) -> None:
    run = tiny_run(corpus, **{"train.max_steps": "4", "train.checkpoint_every": "2"})
    train(run, tmp_path / "r", progress_bar=False)
    complete = latest_checkpoint(tmp_path / "r")
    # A write interrupted before its marker, and one still under its temporary name:
    half = checkpoint_dir(tmp_path / "r", 6)
    shutil.copytree(complete, half)
    (half / MARKER).unlink()
    shutil.copytree(complete, tmp_path / "r" / "checkpoints" / ".step-00000008.tmp-1234")
    assert latest_checkpoint(tmp_path / "r") == complete
    with pytest.raises(ValueError, match="interrupted mid-write"):
        from attnkit.training.checkpoint import load_checkpoint

        load_checkpoint(half)


def test_keeps_the_last_k_checkpoints(tmp_path: Path, corpus: Path) -> None:
    run = tiny_run(corpus, **{"train.max_steps": "6", "train.checkpoint_every": "1", "train.keep_checkpoints": "3"})
    train(run, tmp_path / "r", progress_bar=False)
    assert [p.name for p in complete_checkpoints(tmp_path / "r")] == [f"step-{s:08d}" for s in (4, 5, 6)]


def test_resume_without_checkpoint_starts_over_and_says_so(
    tmp_path: Path, corpus: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        progress, _ = train(
            tiny_run(corpus, **{"train.max_steps": "2"}), tmp_path / "r", resume=True, progress_bar=False
        )
    assert progress.step == 2
    assert "no complete checkpoint" in caplog.text and "starting from the beginning" in caplog.text


def test_resume_refuses_a_different_config(tmp_path: Path, corpus: Path) -> None:
    train(tiny_run(corpus, **{"train.max_steps": "2"}), tmp_path / "r", progress_bar=False)
    with pytest.raises(ValueError, match=r"train\.lr"):
        train(tiny_run(corpus, **{"train.max_steps": "4", "train.lr": "1e-3"}), tmp_path / "r", resume=True)
    progress, _ = train(tiny_run(corpus, **{"train.max_steps": "3"}), tmp_path / "r", resume=True, progress_bar=False)
    assert progress.step == 3  # max_steps may change on resume


def test_an_existing_run_is_not_overwritten(tmp_path: Path, corpus: Path) -> None:
    run = tiny_run(corpus, **{"train.max_steps": "2"})
    train(run, tmp_path / "r", progress_bar=False)
    before = weights(tmp_path / "r")
    with pytest.raises(FileExistsError, match=r"--resume.*--force"):
        train(run, tmp_path / "r")
    assert all(torch.equal(before[k], v) for k, v in weights(tmp_path / "r").items())
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="not empty"):
        train(run, tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


def test_from_pretrained_reads_a_run_directory(tmp_path: Path, corpus: Path) -> None:
    train(tiny_run(corpus, **{"train.max_steps": "3"}), tmp_path / "r", progress_bar=False)
    model = attnkit.from_pretrained(tmp_path / "r")
    saved = weights(tmp_path / "r")
    assert all(torch.equal(p, saved[n]) for n, p in model.named_parameters())
    assert model.tokenizer.get_vocab_size() == model.config.vocab_size


def test_average_is_the_mean_of_the_last_checkpoints(tmp_path: Path, corpus: Path) -> None:
    run = tiny_run(corpus, **{"train.max_steps": "4", "train.checkpoint_every": "1"})
    train(run, tmp_path / "r", progress_bar=False)
    assert main(["average", str(tmp_path / "r"), "--last", "3", "--out", str(tmp_path / "avg")]) == 0
    averaged = dict(attnkit.from_pretrained(tmp_path / "avg").named_parameters())
    last = [load_file(p / "model.safetensors") for p in complete_checkpoints(tmp_path / "r")[-3:]]
    for name, p in averaged.items():
        assert torch.equal(p, (sum(w[name].double() for w in last) / 3).float()), name


def test_cli_train_prints_config_and_trains(tmp_path: Path, corpus: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["train", "--preset", "gpt-tiny", f"--data.path={corpus}", "--data.vocab_size", "400",
            "--train.max_steps=3", "--train.batch_tokens=1024"]  # fmt: skip
    assert main([*args, "--print-config"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["train"]["max_steps"] == 3 and printed["data"]["path"] == [str(corpus)]
    assert main([*args, "--out", str(tmp_path / "r"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "step 3:" in out and "validation: loss" in out
    assert main([*args, "--out", str(tmp_path / "r")]) == 2
    assert "already holds a run" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--train.max_step=3", "did you mean --train.max_steps"),
        ("--train.max_steps=many", "--train.max_steps=many: expected an int"),
        ("--model.dropout=1.5", "dropout must be in [0, 1)"),
        ("--train.precision=fp8", "expected one of"),
        ("--data.path=/nonexistent.txt", "/nonexistent.txt"),
        ("stray", "unrecognised argument 'stray'"),
        ("--model.n_decoder_layers=2", "a gpt model does not use model.n_decoder_layers (got 2"),
        ("--model.rope_theta=5e5", "model.rope_theta (500000.0) is used by rotary positions only"),
        ("--train.objective=span_corruption", "the span_corruption objective trains t5 models, not gpt"),
        (
            "--train.init=runs/pre --model.d_model=64",
            "--model.d_model=64 with train.init=runs/pre: fine-tuning "
            "takes the pretrained model's d_model, not this; drop --model.d_model",
        ),
    ],
)
def test_cli_train_bad_options(tmp_path: Path, corpus: Path, capsys: pytest.CaptureFixture, option: str, message: str):
    args = ["train", "--preset", "gpt-tiny", f"--data.path={corpus}", "--out", str(tmp_path / "r"), *option.split()]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


class StepClock:
    """A stand-in for the trainer's ``time``: each reading is 10 ms after the last, so every
    step takes the same time and a run's horizon is the same in every process."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 0.01
        return self.now


def test_budget_schedule_resumes_on_the_same_curve(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from attnkit.training import trainer

    monkeypatch.setattr(trainer, "time", StepClock())
    # 3 readings a step (log_every=1): 0.03 s a step; the horizon is fixed after step 20.
    changes = {"train.schedule": "budget-linear", "train.time_budget": "1.25", "train.max_steps": "1000"}
    run = tiny_run(corpus, **changes, **{"train.min_lr_ratio": "0", "train.checkpoint_every": "1000"})
    train(run, tmp_path / "straight", progress_bar=False)
    train(run, tmp_path / "resumed", progress_bar=False, session_steps=27)  # after the horizon was fixed
    train(run, tmp_path / "resumed", resume=True, progress_bar=False)
    records = [json.loads(line) for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    (fixed,) = [r for r in records if r["split"] == "schedule"]
    assert fixed["step"] == 20 and 30 < fixed["horizon"] < 60
    steps = [r for r in records if r["split"] == "train"]
    assert steps[-1]["step"] == fixed["horizon"]  # the run ends where the decay does
    assert steps[-1]["lr"] == pytest.approx(0.0, abs=1e-12) and steps[4]["lr"] == pytest.approx(3e-3)
    state = json.loads((latest_checkpoint(tmp_path / "resumed") / "trainer_state.json").read_text())
    assert state["progress"]["horizon"] == fixed["horizon"]
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "resumed")
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert train_losses(tmp_path / "straight") == train_losses(tmp_path / "resumed")


def test_resuming_a_finished_budget_schedule_says_it_will_not_train(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from attnkit.training import trainer

    monkeypatch.setattr(trainer, "time", StepClock())
    changes = {"train.schedule": "budget-cosine", "train.time_budget": "0.9", "train.max_steps": "1000"}
    train(tiny_run(corpus, **changes), tmp_path / "r", progress_bar=False)
    done = latest_checkpoint(tmp_path / "r")
    with caplog.at_level(logging.WARNING, logger="attnkit.training.trainer"):
        progress, _ = train(tiny_run(corpus, **{**changes, "train.time_budget": "60"}), tmp_path / "r", resume=True,
                            progress_bar=False)  # fmt: skip
    assert progress.step == checkpoint_step(done)
    assert "decay ended at step" in caplog.text and "start a new run with a longer train.time_budget" in caplog.text


def test_padding_fraction_counts_every_attention_mask() -> None:
    from attnkit.training.trainer import padding_fraction

    batch = {
        "input_ids": torch.zeros(2, 3, dtype=torch.long),
        "attention_mask": torch.tensor([[1, 1, 0], [1, 1, 1]]),  # 1 of 6 padded
        "decoder_attention_mask": torch.tensor([[1, 0], [1, 1]]),  # 1 of 4
    }
    assert padding_fraction([batch, {"attention_mask": torch.ones(1, 5)}]) == pytest.approx(2 / 15)
    assert padding_fraction([{"labels": torch.zeros(2, 2)}]) == 0.0
