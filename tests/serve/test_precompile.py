"""A server's continuous batch under ``compile="auto"``: each layout decodes eagerly and asks for
its step once; a background process (:mod:`attnkit.serve.precompile`) compiles it into the
compile cache; from then on the batch loads it and decodes the eager tokens through it, and no
step in this process compiled anything."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attnkit
from attnkit.generation import compiled
from attnkit.generation.continuous import ContinuousBatch, Request
from attnkit.serve.precompile import Precompiler

pytestmark = pytest.mark.slow  # the background process compiles a step (about 20 s)


def decode(model: attnkit.models.Model, compile: bool | str, asked: list[tuple[int, int]] | None = None) -> list:
    requests = [Request([5, 6, 7], 12), Request([9, 3], 12)]
    batch = ContinuousBatch(model, compile, None if asked is None else lambda *layout: asked.append(layout))
    batch.add(requests)
    while len(batch):
        batch.step()
    return [r.tokens for r in requests]


def test_a_layout_decodes_eagerly_until_its_step_compiled_in_the_background_is_on_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("ATTNKIT_COMPILE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(compiled, "MODE", "default")  # no autotuning: the background process is told the mode
    torch.manual_seed(0)
    attnkit.build_model("gpt-tiny").save_pretrained(tmp_path / "model")
    model = attnkit.from_pretrained(tmp_path / "model").eval()
    eager = decode(model, False)
    before, graphs = len(compiled.COMPILES), torch._dynamo.utils.counters["stats"]["unique_graphs"]
    asked: list[tuple[int, int]] = []
    assert decode(model, "auto", asked) == eager
    assert asked == [(2, 64)] and len(compiled.COMPILES) == before  # asked once, decoded eagerly

    assert Precompiler(str(tmp_path / "model"), "fp32").compile(2, 64)
    assert decode(model, "auto", asked) == eager
    assert asked == [(2, 64)] and len(compiled.COMPILES) == before + 1 and compiled.COMPILES[-1].loaded
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs  # nothing traced here

    with caplog.at_level("WARNING", logger="attnkit"):
        assert not Precompiler(str(tmp_path / "model"), "fp32").compile(3, 64)
    assert "compiling the decoding step for 3 rows x 64 positions in the background failed" in caplog.text
    assert "no continuous batch is laid out as 3 rows of 64 positions" in caplog.text
