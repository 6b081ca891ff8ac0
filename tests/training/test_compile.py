"""``train.compile``: the model runs under ``torch.compile``, trains to the same losses as
eagerly (to float tolerance), keeps its parameter names in checkpoints, and reports the first
step's compile time in metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_run import tiny_run, train_losses, weights

from attnkit.training import trainer
from attnkit.training.run import train


@pytest.mark.slow
def test_compiled_training_matches_eager(tmp_path: Path, corpus: Path) -> None:
    changes = {"train.max_steps": "3", "model.dropout": "0.0", "model.n_layers": "1"}
    train(tiny_run(corpus, **changes), tmp_path / "eager", progress_bar=False)
    train(tiny_run(corpus, **changes, **{"train.compile": "true"}), tmp_path / "compiled", progress_bar=False)
    torch.testing.assert_close(
        train_losses(tmp_path / "compiled"), train_losses(tmp_path / "eager"), rtol=1e-4, atol=1e-4
    )
    eager, compiled = weights(tmp_path / "eager"), weights(tmp_path / "compiled")
    assert compiled.keys() == eager.keys()  # no "_orig_mod." prefixes
    for name in eager:
        torch.testing.assert_close(compiled[name], eager[name], rtol=1e-3, atol=1e-4)
    records = [json.loads(line) for line in (tmp_path / "compiled" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "compile_seconds" in r] == [1]


def test_compiled_training_keeps_inductors_cache_apart_per_forced_capability(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before the model compiles, as the decoding step does (attnkit.machine.compile_cache);
    # the compile itself is recorded, not run (test_compiled_training_matches_eager runs it).
    calls: list[str] = []
    monkeypatch.setattr(trainer, "compile_cache", lambda: calls.append("cache"))
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, *a, **k: calls.append("compile"))
    run = tiny_run(corpus, **{"train.max_steps": "1", "train.compile": "true"})
    train(run, tmp_path / "run", progress_bar=False)
    assert calls == ["cache", "compile"]
