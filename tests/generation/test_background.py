"""Steps compiled in the background (:mod:`attnkit.generation.background`) under
``compile="auto"``: a layout decodes eagerly and asks for its step once; a process of its own
loads the model as it was loaded and compiles the step into the compile cache; from then on the
decode loads it and decodes the eager tokens through it, and nothing in this process compiled
anything. For a continuous batch (a server's) and for ``generate``'s one-path decode."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import attnkit
from attnkit.generation import background, compiled
from attnkit.generation.background import Precompiler
from attnkit.generation.continuous import ContinuousBatch, Request
from attnkit.models.io import source

pytestmark = pytest.mark.slow  # each background process compiles a step (about 20 s)


@pytest.fixture
def saved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tiny GPT saved to disk, a compile cache of the test's own, inductor's quick mode (the
    background process is told the mode), and compile="auto" on (the suite turns it off)."""
    monkeypatch.setenv("ATTNKIT_COMPILE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ATTNKIT_AUTO_COMPILE", "1")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(compiled, "MODE", "default")
    torch.manual_seed(0)
    attnkit.build_model("gpt-tiny").save_pretrained(tmp_path / "model")
    return tmp_path / "model"


def graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def decode(model: attnkit.models.Model, compile: bool | str, asked: list[tuple] | None = None) -> list:
    requests = [Request([5, 6, 7], 12), Request([9, 3], 12)]
    batch = ContinuousBatch(model, compile, None if asked is None else lambda *layout: asked.append(layout))
    batch.add(requests)
    while len(batch):
        batch.step()
    return [r.tokens for r in requests]


def test_a_batch_layout_decodes_eagerly_until_its_step_compiled_in_the_background_is_on_the_disk(
    saved: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = attnkit.from_pretrained(saved).eval()
    assert source(model) == (str(saved.resolve()), "fp32")
    eager = decode(model, False)
    before, traced = len(compiled.COMPILES), graphs()
    asked: list[tuple] = []
    assert decode(model, "auto", asked) == eager
    assert asked == [("batch", 2, 64)] and len(compiled.COMPILES) == before  # asked once, decoded eagerly

    assert Precompiler(str(saved), "fp32").compile("batch", 2, 64)
    assert decode(model, "auto", asked) == eager
    assert asked == [("batch", 2, 64)] and len(compiled.COMPILES) == before + 1 and compiled.COMPILES[-1].loaded
    assert graphs() == traced  # nothing traced here

    with caplog.at_level("WARNING", logger="attnkit"):
        assert not Precompiler(str(saved), "fp32").compile("batch", 3, 64)
    assert "compiling the decoding step for 3 rows x 64 positions (batch) in the background failed" in caplog.text
    assert "no continuous batch is laid out as 3 rows of 64 positions" in caplog.text


def test_generate_asks_for_its_step_once_and_moves_onto_it_when_it_appears(
    saved: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = attnkit.from_pretrained(saved)
    ids = torch.tensor([[0, 5, 6, 7], [9, 3, 4, 8]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])  # left-padded: the step reads a key mask
    eager = model.generate(ids, mask, max_new_tokens=10, compile=False)
    monkeypatch.setattr(compiled, "LOAD_SECONDS", 1e-9)
    monkeypatch.setattr(compiled, "COMPILE_SECONDS", 1e-9)  # a model built here would compile now
    asked: list[tuple] = []
    monkeypatch.setattr(background, "for_model", lambda m: lambda *layout: asked.append(layout))
    before, traced = len(compiled.COMPILES), graphs()
    for _ in range(2):  # asked once; never compiled here, for a model another process can load
        assert torch.equal(model.generate(ids, mask, max_new_tokens=10), eager)
    assert asked == [("generate", 2, 64, True)] and len(compiled.COMPILES) == before and graphs() == traced

    assert Precompiler(str(saved), "fp32").compile(*asked[0])
    assert torch.equal(model.generate(ids, mask, max_new_tokens=10), eager)  # moved mid-decode onto the loaded step
    assert len(compiled.COMPILES) == before + 1 and compiled.COMPILES[-1].loaded and graphs() == traced
