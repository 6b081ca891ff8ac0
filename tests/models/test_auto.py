"""``weights="auto"`` (:mod:`attnkit.models.auto`): the measured order per job and CPU class
(classes forced with ``ATTNKIT_CPU_CLASS``), the perplexity check and its bounds recomputed
here from the models themselves, the fallback to fp32 with its reasons, saved formats kept; the
model each choice gives is, logit for logit, that format's own (whose distance from fp32
tests/models/test_weights.py bounds)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import attnkit
from attnkit import kernels
from attnkit.loading import load_auto
from attnkit.machine import detected_cpu_class
from attnkit.models import auto
from attnkit.models.weights import to_format

needs_blocks = pytest.mark.skipif(
    not kernels.available(), reason="this machine cannot build or run the int4/int8 C kernel"
)


def saved(name: str, path: Path, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    attnkit.build_model(name).eval().save_pretrained(path)
    return path


@torch.no_grad()
def assert_same_logits(model: torch.nn.Module, reference: torch.nn.Module) -> None:
    """``model`` computes exactly what ``reference`` does: equal logits, bit for bit."""
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    decoder = {"decoder_input_ids": ids[:, :3]} if reference.config.is_encoder_decoder else {}
    torch.testing.assert_close(model(ids, **decoder).logits, reference(ids, **decoder).logits, rtol=0, atol=0)


def loss_ratio(path: Path, weights: str) -> float:
    """The check's perplexity in ``weights`` over fp32's, computed apart from the module."""
    ids = auto.check_ids(attnkit.from_pretrained(path))

    def ppl(model: torch.nn.Module) -> float:
        with torch.no_grad():
            logits = model(ids).logits[0, :-1].float()
        return math.exp(F.cross_entropy(logits, ids[0, 1:]).item())

    return ppl(attnkit.from_pretrained(path, weights=weights)) / ppl(attnkit.from_pretrained(path))


@needs_blocks
def test_decoding_takes_int8_on_every_class_that_runs_the_blocks(tmp_path: Path, monkeypatch) -> None:
    path = saved("gpt-tiny", tmp_path / "gpt")
    for name in ("avx2", detected_cpu_class()):
        monkeypatch.setenv("ATTNKIT_CPU_CLASS", name)
        model, choice = load_auto(path)
        assert choice.weights == "int8" == model.weights
        ratio = loss_ratio(path, "int8")
        assert ratio <= auto.BOUNDS["int8"] and f"{ratio:.4f}x fp32's" in choice.reason, choice.reason
        reference = attnkit.from_pretrained(path, weights="int8")
        ids = torch.tensor([[3, 4, 5]])
        assert torch.equal(model.generate(ids, max_new_tokens=5), reference.generate(ids, max_new_tokens=5))


@needs_blocks
def test_translation_takes_int8_then_bf16_only_where_it_is_native(tmp_path: Path, monkeypatch) -> None:
    path = saved("transformer-tiny", tmp_path / "translator")
    for name in ("avx2", detected_cpu_class()):
        monkeypatch.setenv("ATTNKIT_CPU_CLASS", name)
        model, choice = load_auto(path)
        assert choice.weights == "int8" == model.weights and "the fastest for translate" in choice.reason
        assert_same_logits(model, attnkit.from_pretrained(path, weights="int8"))
    monkeypatch.setitem(auto.BOUNDS, "int8", 0.5)  # int8 cannot pass: the next format in the order
    monkeypatch.setenv("ATTNKIT_CPU_CLASS", "avx2")
    model, choice = load_auto(path)
    assert choice.weights == "fp32" and choice.reason.startswith("no faster format passed the check")
    assert next(model.parameters()).dtype == torch.float32
    assert_same_logits(model, attnkit.from_pretrained(path, weights="fp32"))
    if detected_cpu_class() == "avx512-bf16":
        monkeypatch.delenv("ATTNKIT_CPU_CLASS")
        model, choice = load_auto(path)
        assert choice.weights == "bf16" and next(model.parameters()).dtype == torch.bfloat16
        assert_same_logits(model, attnkit.from_pretrained(path, weights="bf16"))


def test_a_model_failing_every_check_stays_fp32_and_says_why(tmp_path: Path, monkeypatch) -> None:
    path = saved("gpt-tiny", tmp_path / "gpt")
    monkeypatch.setattr(auto, "BOUNDS", {name: 0.5 for name in auto.BOUNDS})  # nothing can pass
    model, choice = load_auto(path)
    assert choice.weights == "fp32" and getattr(model, "weights", "fp32") == "fp32"
    assert choice.reason.startswith("no faster format passed the check on this model: ")
    for weights in auto.candidates("decode", torch.device("cpu"))[:-1]:
        assert f"{weights} " in choice.reason and "(bound 0.5x)" in choice.reason
    fp32 = attnkit.from_pretrained(path)
    for ours, theirs in zip(model.state_dict().values(), fp32.state_dict().values(), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


@needs_blocks
def test_a_model_saved_quantised_is_kept_as_saved(tmp_path: Path) -> None:
    torch.manual_seed(0)
    quantised = to_format(attnkit.build_model("gpt-tiny"), "int8")
    quantised.save_pretrained(tmp_path)
    model, choice = load_auto(tmp_path)
    assert choice.weights == "int8" == model.weights and "saved in int8" in choice.reason
    assert_same_logits(model, quantised)  # its blocks as saved, not quantised again


def test_from_pretrained_takes_auto_and_an_unknown_format_is_refused(tmp_path: Path, monkeypatch) -> None:
    path = saved("gpt-tiny", tmp_path / "gpt")
    monkeypatch.setenv("ATTNKIT_CPU_CLASS", "avx2")
    chosen = auto.candidates("decode", torch.device("cpu"))[0]
    model = attnkit.from_pretrained(path, weights="auto")
    assert getattr(model, "weights", "fp32") == chosen
    assert_same_logits(model, attnkit.from_pretrained(path, weights=chosen))
    with pytest.raises(ValueError, match="'int3' is not a weight format; use one of auto, fp32"):
        attnkit.from_pretrained(path, weights="int3")


def test_an_encoder_only_model_runs_as_trained(tmp_path: Path) -> None:
    model, choice = load_auto(saved("bert-tiny", tmp_path / "bert"))
    assert choice.weights == "fp32" and "encoder-only" in choice.reason and getattr(model, "weights", "fp32") == "fp32"
    assert_same_logits(model, attnkit.from_pretrained(tmp_path / "bert", weights="fp32"))
