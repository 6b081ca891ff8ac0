"""Llama (rotary halves, RMSNorm, SwiGLU, grouped-query attention) against randomly
initialised ``transformers`` ``LlamaForCausalLM`` models: logits both ways, greedy and beam
generations with left padding, and a KV cache that holds only the key/value heads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

import attnkit
from attnkit.generation import IncrementalModel

transformers = pytest.importorskip("transformers")


def _hf(kv_heads: int, tied: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=120, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=kv_heads, max_position_embeddings=64, tie_word_embeddings=tied, rope_theta=500.0,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


CASES = [(2, False), (4, True), (1, False)]  # grouped-query untied, multi-head tied, multi-query


@pytest.mark.parametrize(("kv_heads", "tied"), CASES)
@torch.no_grad()
def test_llama_logits_and_generations_equal_transformers_both_ways(tmp_path: Path, kv_heads: int, tied: bool) -> None:
    hf = _hf(kv_heads, tied)
    hf.save_pretrained(tmp_path / "hf")
    model = attnkit.from_pretrained(tmp_path / "hf")
    assert model.config.n_kv_heads == kv_heads and model.config.rope_theta == 500.0
    ids = torch.randint(0, 120, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # a left-padded prompt: rotary positions count from its first real token
    reference = hf(ids, attention_mask=mask).logits
    assert_close(model(ids, mask).logits[mask.bool()], reference[mask.bool()], atol=1e-4, rtol=1e-4)
    options = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(
        model.generate(ids, mask, max_new_tokens=8, eos_token_id=None), hf.generate(ids, attention_mask=mask, **options)
    )
    beams = model.generate(
        ids, mask, max_new_tokens=8, num_beams=3, length_penalty=1.0, length_penalty_style="power", eos_token_id=None
    )
    assert torch.equal(beams, hf.generate(ids, attention_mask=mask, num_beams=3, early_stopping=True, **options))
    attnkit.export_hf(model, tmp_path / "out")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert_close(back(ids).logits, hf(ids).logits, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_the_cache_holds_the_key_value_heads_only() -> None:
    model = attnkit.build_model(attnkit.preset("llama-tiny")).eval()  # 4 query heads, 2 key/value heads
    ids = torch.randint(0, 1000, (3, 5))
    incremental = IncrementalModel(model, ids, None)
    incremental.start()
    for cache in incremental.cache.self_attn:
        assert cache.k.shape[:2] == (3, 2) and cache.v.shape[:2] == (3, 2)
    beams = IncrementalModel(model, ids, None, copies=2)
    beams.start()
    beams.step(torch.zeros(6, dtype=torch.long))
    assert beams.cache.self_attn[0]._k.shape[:2] == (3, 2)  # one row per example, kv heads only


def test_bad_llama_configs_are_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"n_kv_heads \(3\) must divide n_heads \(4\)"):
        attnkit.preset("llama-tiny", n_kv_heads=3)
    hf = _hf(2, False)
    hf.config.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}
    hf.save_pretrained(tmp_path / "scaled")
    with pytest.raises(ValueError, match=r"rope scaling .* is not supported"):
        attnkit.from_pretrained(tmp_path / "scaled")
