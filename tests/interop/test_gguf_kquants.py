"""GGUF's K-quants and other block types kept as blocks (``weights="gguf"``): Q4_K as Q4_1 whose
dequantisation equals the ``gguf`` package's within the fp16 rounding of each block's scale and
minimum; Q5_0, Q5_K, Q6_K requantised to Q8_0, within half an int8 step of each block's largest
value; a SmolLM2 file with some of its weights rewritten as Q4_K and Q5_0 loads with those
layouts and the logits of the same file loaded in fp32; a NaN Q4_K scale names its tensor."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.testing import assert_close

import attnkit
from attnkit.interop import gguf as ours
from attnkit.kernels import blocks
from attnkit.nn.quantized import layouts

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

BYTES = {T.Q4_K: 144, T.Q5_K: 176, T.Q6_K: 210}  # a superblock of 256 values


def q4_k(w: np.ndarray) -> np.ndarray:
    """``w`` (rows, k), k a multiple of 256, as Q4_K bytes (rows, k / 256 · 144): each block of 32's
    span min-max (its minimum at most 0), the superblock's scales and minima to 6 bits, as
    llama.cpp's layout holds them (a simple quantiser: the test needs valid blocks, not good ones)."""
    rows = w.shape[0]
    sub = w.reshape(rows, -1, 8, 32).astype(np.float32)  # (rows, supers, 8, 32)
    low = np.minimum(sub.min(-1), 0)
    scale = (sub.max(-1) - low) / 15
    d = (scale.max(-1, keepdims=True) / 63).astype(np.float16)
    dmin = (-low.min(-1, keepdims=True) / 63).astype(np.float16)
    safe = lambda x: np.where(x > 0, x, 1).astype(np.float32)  # noqa: E731
    sc = np.clip(np.round(scale / safe(d)), 1, 63).astype(np.uint8)
    m = np.clip(np.round(-low / safe(dmin)), 0, 63).astype(np.uint8)
    step = (d.astype(np.float32) * sc)[..., None]
    q = np.clip(np.round((sub + (dmin.astype(np.float32) * m)[..., None]) / safe(step)), 0, 15).astype(np.uint8)
    packed = np.empty((*sub.shape[:2], 12), np.uint8)
    packed[..., 0:4] = (sc[..., :4] & 63) | ((sc[..., 4:] >> 4) << 6)
    packed[..., 4:8] = (m[..., :4] & 63) | ((m[..., 4:] >> 4) << 6)
    packed[..., 8:12] = (sc[..., 4:] & 15) | ((m[..., 4:] & 15) << 4)
    pairs = q.reshape(*sub.shape[:2], 4, 2, 32)  # blocks 2c and 2c + 1 share run c's bytes
    qs = (pairs[..., 0, :] | (pairs[..., 1, :] << 4)).reshape(*sub.shape[:2], 128)
    heads = np.concatenate([t.view(np.uint8).reshape(*t.shape[:2], 2) for t in (d, dmin)], -1)
    return np.concatenate([heads, packed, qs], -1).reshape(rows, -1)


def random_blocks(kind: T, rows: int, supers: int, seed: int) -> np.ndarray:
    """Random bytes of ``kind`` with their fp16 superblock scales set to small finite values."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, supers, BYTES[kind]), dtype=np.uint8)
    scales = rng.uniform(1e-3, 1e-2, (rows, supers, 2)).astype(np.float16).view(np.uint8)
    at = {T.Q4_K: 0, T.Q5_K: 0, T.Q6_K: 208}[kind]  # d (and dmin) first, or Q6_K's d last
    width = 2 if kind == T.Q6_K else 4
    raw[..., at : at + width] = scales[..., :width]
    return raw.reshape(rows, -1)


def fake(kind: T, raw: np.ndarray, k: int, name: str = "blk.0.ffn_down.weight") -> SimpleNamespace:
    """What the blocks' loader reads of a GGUFReader tensor."""
    return SimpleNamespace(name=name, tensor_type=kind, data=raw, shape=np.array([k, raw.shape[0]]))


@pytest.mark.parametrize("source", ["random", "quantised"])
def test_q4_k_becomes_q4_1_with_its_values_as_they_are(source: str) -> None:
    rows, k = 6, 512
    if source == "random":
        raw = random_blocks(T.Q4_K, rows, k // 256, seed=0)
    else:
        raw = q4_k(np.random.default_rng(1).standard_normal((rows, k)).astype(np.float32))
    expected = torch.from_numpy(dequantize(raw, T.Q4_K).reshape(rows, k))
    layout, data, d, m = ours._blocks_of(fake(T.Q4_K, raw, k), Path("f.gguf"), lambda: None)
    assert layout == "q4_1" and data.shape == (rows, k // 2) and d.shape == m.shape == (rows, k // 32)
    got = blocks.dequantize("q4_1", data, d, m)
    # only the scale d·sc and minimum dmin·m are rounded (to fp16): within 2^-11 of each
    bound = (15 * d.float().abs() + m.float().abs()).repeat_interleave(32, dim=1) * 2**-11
    assert ((got - expected).abs() <= bound + 1e-7).all()
    assert_close(got, expected, atol=2e-3 * expected.abs().max().item(), rtol=0)


@pytest.mark.parametrize("kind", [T.Q5_K, T.Q6_K, T.Q5_0])
def test_other_types_are_requantised_to_q8_0_within_half_a_step(kind: T) -> None:
    rows, k = 5, 512
    if kind == T.Q5_0:
        raw = quantize(np.random.default_rng(2).standard_normal((rows, k)).astype(np.float32), kind)
    else:
        raw = random_blocks(kind, rows, k // 256, seed=3)
    tensor = fake(kind, raw, k)
    values = ours._values(tensor, Path("f.gguf"))
    assert_close(values, torch.from_numpy(dequantize(raw, kind).reshape(rows, k)), atol=0, rtol=0)
    layout, data, d, m = ours._blocks_of(tensor, Path("f.gguf"), lambda: values)
    assert layout == "q8_0" and m is None and data.dtype == torch.int8
    got = blocks.dequantize("q8_0", data, d)
    peak = values.view(rows, -1, 32).abs().amax(-1).repeat_interleave(32, dim=1)
    assert ((got - values).abs() <= peak / 254 * 1.01 + 1e-7).all()


def test_a_nan_q4_k_scale_names_its_tensor() -> None:
    raw = random_blocks(T.Q4_K, 2, 1, seed=4)
    raw[1, 0:2] = np.array([0x7E00], dtype=np.uint16).view(np.uint8)  # row 1's d: an fp16 NaN
    with pytest.raises(ValueError, match=r"f\.gguf: tensor blk\.0\.ffn_down\.weight has a block scale that is NaN"):
        ours._blocks_of(fake(T.Q4_K, raw, 256), Path("f.gguf"), lambda: None)
    with pytest.raises(ValueError, match="not whole blocks of 144; the file is truncated or corrupt"):
        ours._blocks_of(fake(T.Q4_K, raw[:, :100], 256), Path("f.gguf"), lambda: None)


# K-quants need rows of a multiple of 256: SmolLM2's 576-wide projections cannot be (llama.cpp gives
# them another type too), its 1536-wide down projections can.
REWRITTEN = {"blk.0.ffn_down.weight": T.Q4_K, "blk.2.attn_k.weight": T.Q5_0, "blk.1.attn_q.weight": T.Q5_1}


@pytest.fixture(scope="module")
def rewritten(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2's GGUF file with three weights rewritten: a down projection as Q4_K, a query and a key
    projection (whose rotary rows the loader permutes back) as Q5_1 and Q5_0."""
    reader = gguf.GGUFReader(str(smollm2_gguf))
    path = tmp_path_factory.mktemp("kquants") / "smollm2-kquants.gguf"
    writer = gguf.GGUFWriter(str(path), arch=None)
    for field in reader.fields.values():
        if field.name.startswith("GGUF."):
            continue  # the header's own counts: the writer writes its own
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for tensor in reader.tensors:
        kind = REWRITTEN.get(tensor.name)
        if kind is None:
            writer.add_tensor(tensor.name, tensor.data, raw_shape=tensor.data.shape, raw_dtype=tensor.tensor_type)
            continue
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        raw = q4_k(values) if kind == T.Q4_K else quantize(values, kind)
        writer.add_tensor(tensor.name, raw, raw_shape=raw.shape, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@torch.no_grad()
def test_a_file_with_k_quants_computes_on_their_blocks(rewritten: Path) -> None:
    from attnkit import kernels

    if not kernels.available():
        pytest.skip("this CPU or machine cannot run its C kernel that computes on GGUF blocks")
    fp32 = attnkit.from_pretrained(rewritten)
    held = attnkit.from_pretrained(rewritten, weights="gguf")
    found = layouts(held)
    assert found["decoder.layers.0.ffn.w_2"] == "q4_1" and found["decoder.layers.2.self_attn.w_k"] == "q8_0"
    assert found["decoder.layers.1.self_attn.w_q"] == "q8_0" and found["decoder.layers.1.ffn.w_2"] == "q4_1"
    pairs = [
        (held.decoder.layers[0].ffn.w_2, fp32.decoder.layers[0].ffn.w_2.weight, 2**-10),
        (held.decoder.layers[2].self_attn.w_k, fp32.decoder.layers[2].self_attn.w_k.weight, 1 / 254),
        (held.decoder.layers[1].self_attn.w_q, fp32.decoder.layers[1].self_attn.w_q.weight, 1 / 254),
    ]
    for layer, weight, step in pairs:  # the fp32 load's weights are the gguf package's dequantisation
        assert_close(
            blocks.dequantize(layer.layout, *layer.whole()), weight, atol=step * weight.abs().max().item(), rtol=0
        )
    ids = torch.tensor([fp32.tokenizer.encode("The capital of France is").ids])
    reference = fp32(ids).logits
    # as for the file's own blocks (tests/interop/test_gguf.py): only the activations' quantisation
    # differs, 0.036 of the largest logit here (0.045 on another prompt; 2026-12-07, AMD EPYC avx512-bf16)
    assert_close(held(ids).logits, reference, atol=0.05 * reference.abs().max().item(), rtol=0)
