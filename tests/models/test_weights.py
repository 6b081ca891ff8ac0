"""Inference weight formats: int8 rows pack and unpack within one quantisation step; every
family in bf16 and int8 gives logits close to its fp32 self (tolerance below) and decodes
greedy, beam and sampled; formats are chosen at load time and never saved."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import attnkit
from attnkit import kernels
from attnkit.models import build_model, weights
from attnkit.models.weights import Int8Linear, int8_linear, quantize_rows, to_format

FAMILIES = ["gpt-tiny", "bert-tiny", "t5-tiny", "transformer-tiny"]
# Stated tolerance: |logits - fp32 logits| <= TOLERANCE[format] * max|fp32 logits|, elementwise
# (bf16 keeps 8 bits of mantissa through every layer; int8 adds to that half a step of 1/127
# of each row's largest weight per matrix).
TOLERANCE = {"bf16": 0.05, "int8": 0.05}
# On any CPU: where bf16 is not native the formats run on PyTorch's emulated bf16 (tests/conftest.py);
# "int8-avx2" is int8 as an AVX2-only CPU runs it, fp32 activations through attnkit's kernel.
pytestmark = pytest.mark.usefixtures("bf16_formats")
FORMATS = ["bf16", "int8", "int8-avx2"]
TOLERANCE["int8-avx2"] = 0.05  # int8's, the activations quantised per block of 32 instead of rounded to bf16


@pytest.fixture(autouse=True)
def cpu_of(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, bf16_formats: None) -> None:
    """A test of the format "int8-avx2" sees a CPU without native bf16 (and skips without AVX2)."""
    if "int8-avx2" in request.node.name:
        if not kernels.available("avx2"):
            pytest.skip("this CPU or machine cannot run the AVX2 kernel")
        monkeypatch.setattr(weights, "native_bf16", lambda device: False)


def test_int8_rows_unpack_within_one_quantisation_step() -> None:
    w = torch.randn(48, 32) * torch.linspace(0.01, 3, 48)[:, None]
    w[5] = 0.0
    q, scales = quantize_rows(w)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= 127
    assert (q.float().abs().amax(dim=1)[torch.arange(48) != 5] == 127).all()  # each row uses its range
    error = (q.float() * scales[:, None] - w).abs()
    assert (error <= scales[:, None] / 2 + 1e-7).all()
    assert scales[5] == 1 and (q[5] == 0).all()


@pytest.mark.parametrize(("dtype", "blocks"), [(torch.float32, False), (torch.bfloat16, False), (torch.float32, True)])
def test_int8_matmul_equals_the_dequantised_product(dtype: torch.dtype, blocks: bool) -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(50, 40)  # 50 inputs: padded to 64 for the blocks of 32
    x = torch.randn(3, 7, 50, dtype=dtype)
    layer = Int8Linear(linear, blocks)
    assert layer.weight_int8.shape == (40, 64) and (layer.weight_int8[:, 50:] == 0).all()
    scales = layer.scales.repeat_interleave(32, 1) if blocks else layer.scales[:, None]  # (40, 64) or (40, 1)
    dequantised = (layer.weight_int8.float() * scales)[:, :50]
    expected = F.linear(x.float(), dequantised, linear.bias.detach())
    got = int8_linear(x, layer.weight_int8, layer.scales, layer.bias.to(dtype))
    assert got.shape == (3, 7, 40) and got.dtype == dtype
    # rows: exact in fp32, bf16 activations rounded; blocks: activations quantised per block of 32
    tol = 1e-5 if dtype == torch.float32 and not blocks else 3e-2
    assert_close(got.float(), expected, atol=tol * expected.abs().max().item(), rtol=0)
    if blocks:  # and exactly the kernel's product
        flat = F.pad(x.reshape(-1, 50), (0, 14))
        exact = kernels.int8_matmul_reference(flat, layer.weight_int8, layer.scales) + linear.bias.detach()
        assert_close(got.reshape(-1, 40), exact, atol=1e-5 * exact.abs().max().item(), rtol=1e-5)


def model_dir(tmp_path: Path, name: str) -> Path:
    torch.manual_seed(0)
    model = build_model(attnkit.preset(name, d_model=64, d_ff=128, dropout=0.0, vocab_size=97))
    model.save_pretrained(tmp_path / name)
    return tmp_path / name


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        if model.config.is_encoder_decoder:
            return model(ids, decoder_input_ids=ids[:, :5]).logits.float()
        return model(ids).logits.float()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_in_every_format_is_close_to_fp32(tmp_path: Path, name: str, fmt: str) -> None:
    directory = model_dir(tmp_path, name)
    ids = torch.randint(4, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    reference = logits(attnkit.from_pretrained(directory), ids)
    model = attnkit.from_pretrained(directory, weights=fmt.removesuffix("-avx2"))
    assert model.weights == fmt.removesuffix("-avx2")
    if fmt.startswith("int8"):
        assert not any(type(m) is torch.nn.Linear for m in model.modules())
        activations = torch.float32 if fmt == "int8-avx2" else torch.bfloat16
        assert {p.dtype for p in model.parameters()} == {activations}
    got = logits(model, ids)
    assert_close(got, reference, atol=TOLERANCE[fmt] * reference.abs().max().item(), rtol=0)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", ["gpt-tiny", "transformer-tiny", "t5-tiny"])
def test_greedy_beam_and_sampling_run_in_every_format(tmp_path: Path, name: str, fmt: str) -> None:
    model = attnkit.from_pretrained(model_dir(tmp_path, name), weights=fmt.removesuffix("-avx2"))
    ids = torch.randint(4, 97, (2, 6), generator=torch.Generator().manual_seed(2))
    for options in ({}, {"num_beams": 3}, {"do_sample": True, "top_k": 5, "seed": 0}):
        out = model.generate(ids, max_new_tokens=4, **options)
        assert out.dtype == torch.long and out.shape[0] == 2


def test_hugging_face_directories_load_in_int8(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=101, n_embd=32, n_head=4, n_layer=2, n_positions=40)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "hf")
    ids = torch.randint(0, 101, (2, 8), generator=torch.Generator().manual_seed(3))
    reference = logits(attnkit.from_pretrained(tmp_path / "hf"), ids)
    got = logits(attnkit.from_pretrained(tmp_path / "hf", weights="int8"), ids)
    assert_close(got, reference, atol=TOLERANCE["int8"] * reference.abs().max().item(), rtol=0)


def test_formats_are_not_saved_and_bad_formats_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = model_dir(tmp_path, "gpt-tiny")
    model = attnkit.from_pretrained(directory, weights="int8")
    with pytest.raises(ValueError, match="holds int8 inference weights; save the fp32 model"):
        model.save_pretrained(tmp_path / "out")
    with pytest.raises(ValueError, match="holds int8 inference weights"):
        attnkit.export_hf(model, tmp_path / "hf")
    assert not (tmp_path / "out").exists() and not (tmp_path / "hf").exists()
    with pytest.raises(ValueError, match="weights='int4' is not a weight format; use one of fp32, bf16, int8"):
        attnkit.from_pretrained(directory, weights="int4")
    monkeypatch.setattr(weights, "native_bf16", lambda device: False)
    with pytest.raises(ValueError, match=r"weights='bf16' computes in bf16, which this cpu does not .* or 'fp32'"):
        to_format(build_model(attnkit.preset("gpt-tiny")), "bf16")
    monkeypatch.setattr(kernels, "available", lambda kernel="avx2": False)
    with pytest.raises(
        ValueError, match=r"weights='int8' needs native bf16 or attnkit's AVX2 kernel, .* weights='fp32'"
    ):
        to_format(build_model(attnkit.preset("gpt-tiny")), "int8")
