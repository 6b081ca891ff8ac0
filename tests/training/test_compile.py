"""``train.compile``: the model runs under ``torch.compile``, trains to the same losses as
eagerly (to float tolerance), keeps its parameter names in checkpoints, and reports the first
step's compile time in metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_run import tiny_run, train_losses, weights

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
