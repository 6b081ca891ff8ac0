"""The models ``weights="auto"`` prepares, kept on the disk (:mod:`attnkit.prepared`): a second
load reads the kept model (no source read, no check) and decodes as the first did; anything the
key holds changed, a corrupted entry or a cache that cannot be written prepares again, saying so;
the cache keeps its most recent entries only."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

import attnkit
from attnkit import kernels, loading, prepared
from attnkit.machine import detected_cpu_class

pytestmark = pytest.mark.skipif(not kernels.available(), reason="int8, auto's choice, needs the C block kernel")


def saved(path: Path, name: str = "gpt-tiny", seed: int = 0) -> Path:
    torch.manual_seed(seed)
    attnkit.build_model(name).eval().save_pretrained(path)
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(prepared.CACHE_ENV, str(tmp_path / "prepared"))
    return tmp_path / "prepared"


def refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError("the source was read or checked again")


def test_a_second_load_reads_the_kept_model_and_decodes_alike(tmp_path: Path, cache: Path, monkeypatch) -> None:
    path = saved(tmp_path / "gpt")
    first, choice = loading.load_auto(path)
    assert choice.weights == "int8" and [p.name for p in cache.iterdir()] == [prepared.entry(path, "decode").name]
    monkeypatch.setattr(loading, "_load", refuse)
    monkeypatch.setattr(loading, "choose", refuse)
    second, again = loading.load_auto(path)
    assert again.weights == "int8" and again.reason.startswith(choice.reason) and "kept in" in again.reason
    assert second.weights == "int8" and second.__dict__["_loaded_from"] == (str(path), "auto")
    ids = torch.tensor([[3, 4, 5, 6]])
    torch.testing.assert_close(second(ids).logits, first(ids).logits, rtol=0, atol=0)
    assert torch.equal(second.generate(ids, max_new_tokens=8), first.generate(ids, max_new_tokens=8))
    assert attnkit.from_pretrained(path, weights="auto").weights == "int8"  # the same entry, by its own job


def test_an_encoder_decoder_is_kept_for_its_own_job(tmp_path: Path, cache: Path, monkeypatch) -> None:
    path = saved(tmp_path / "translator", "transformer-tiny")
    first, _ = loading.load_auto(path)
    monkeypatch.setattr(loading, "_load", refuse)
    model, choice = loading.load_auto(path)  # found under "translate", not mistaken for a "decode" entry
    assert choice.weights == "int8" == model.weights and model.config.is_encoder_decoder
    ids = torch.tensor([[3, 4, 5, 6]])
    kept = model(ids, decoder_input_ids=ids).logits  # the kept model is the one first prepared
    torch.testing.assert_close(kept, first(ids, decoder_input_ids=ids).logits, rtol=0, atol=0)
    assert prepared.read(path, "decode") is None


@pytest.mark.parametrize("change", ["source", "cpu class", "torch", "code", "bounds"])
def test_anything_the_choice_depends_on_prepares_again(tmp_path: Path, cache: Path, monkeypatch, change: str) -> None:
    path = saved(tmp_path / "gpt")
    loading.load_auto(path)
    if change == "source":
        os.utime(path / "model.safetensors", ns=(1, 1))
    elif change == "cpu class":
        if detected_cpu_class() not in ("avx512", "avx512-bf16"):
            pytest.skip(f"a {detected_cpu_class()} CPU has no lower class that runs int8 to act as")
        monkeypatch.setenv("ATTNKIT_CPU_CLASS", "avx2")
    elif change == "torch":
        monkeypatch.setattr(torch, "__version__", "0.0.0")
    elif change == "code":
        monkeypatch.setattr(prepared, "code_identity", lambda: "another")
    else:
        monkeypatch.setitem(attnkit.models.auto.BOUNDS, "int8", 1.02)
    assert prepared.read(path, "decode") is None
    checks = []
    choose = attnkit.models.auto.choose
    monkeypatch.setattr(loading, "choose", lambda model, job: checks.append(job) or choose(model, job))
    loading.load_auto(path)
    assert checks == ["decode"] and len(list(cache.iterdir())) == 2


def test_a_corrupted_entry_is_dropped_with_one_line_and_prepared_again(tmp_path: Path, cache: Path, caplog) -> None:
    path = saved(tmp_path / "gpt")
    first, _ = loading.load_auto(path)
    weights = prepared.entry(path, "decode") / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        model, choice = loading.load_auto(path)
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "cannot be read" in line and "preparing it again" in line and str(path) in line
    assert choice.weights == "int8" and "kept in" not in choice.reason
    ids = torch.tensor([[3, 4, 5]])
    torch.testing.assert_close(model(ids).logits, first(ids).logits, rtol=0, atol=0)
    assert prepared.read(path, "decode") is not None  # written whole again


def test_a_cache_that_cannot_be_written_leaves_the_load_alone(tmp_path: Path, monkeypatch, caplog) -> None:
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv(prepared.CACHE_ENV, str(blocker / "prepared"))
    path = saved(tmp_path / "gpt")
    with caplog.at_level(logging.WARNING, logger="attnkit"):
        model, choice = loading.load_auto(path)
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "cannot be kept" in line and prepared.CACHE_ENV in line
    assert choice.weights == "int8" == model.weights
    ids = torch.tensor([[3, 4, 5]])  # the int8 model itself, as from_pretrained gives it
    expected = attnkit.from_pretrained(path, weights="int8")(ids).logits
    torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)


def test_the_cache_keeps_its_most_recently_used_entries(tmp_path: Path, cache: Path, monkeypatch) -> None:
    monkeypatch.setattr(prepared, "KEEP", 2)
    paths = [saved(tmp_path / f"gpt{i}", seed=i) for i in range(3)]
    loading.load_auto(paths[0])
    loading.load_auto(paths[1])
    os.utime(prepared.entry(paths[1], "decode"), (1, 1))  # long unused
    loading.load_auto(paths[0])  # used again: the newest
    loading.load_auto(paths[2])
    assert sorted(p.name for p in cache.iterdir()) == sorted(prepared.entry(p, "decode").name for p in paths[::2])
