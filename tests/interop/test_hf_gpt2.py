"""GPT-2 exchange: a randomly initialised transformers GPT2LMHeadModel, converted by the
production converter, gives the same logits in attnkit; attnkit's export gives them back."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

import attnkit

transformers = pytest.importorskip("transformers")


def hf_gpt2(seed: int, tie: bool = True) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=101, n_embd=32, n_head=4, n_layer=3, n_positions=40, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, tie_word_embeddings=tie, bos_token_id=100, eos_token_id=100,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # non-trivial norms and biases, so that a wrong mapping shows
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.normal_(0.0 if name.endswith("bias") else 1.0, 0.1)
    return model


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 101, (3, 17), generator=g)
    mask = torch.ones(3, 17, dtype=torch.long)
    mask[1, 11:] = 0
    mask[2, 5:] = 0
    return ids, mask


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
def test_gpt2_logits_match_transformers(tmp_path: Path, seed: int, tie: bool) -> None:
    hf = hf_gpt2(seed, tie)
    hf.save_pretrained(tmp_path / "hf")
    ours = attnkit.from_pretrained(tmp_path / "hf")
    ids, mask = batch(seed)
    with torch.no_grad():
        expected = hf(ids, attention_mask=mask)
        got = ours(ids, attention_mask=mask)
    real = mask.bool()  # padded query rows are undefined on both sides
    assert_close(got.logits[real], expected.logits[real], atol=1e-5, rtol=1e-5)
    assert_close(ours(ids).logits, hf(ids).logits, atol=1e-5, rtol=1e-5)


def test_gpt2_export_round_trip(tmp_path: Path) -> None:
    hf = hf_gpt2(3)
    hf.save_pretrained(tmp_path / "hf")
    ours = attnkit.from_pretrained(tmp_path / "hf")
    attnkit.export_hf(ours, tmp_path / "back")
    again = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "back").eval()
    ids, mask = batch(3)
    with torch.no_grad():
        assert_close(again(ids, attention_mask=mask).logits, hf(ids, attention_mask=mask).logits, atol=1e-5, rtol=0)
    for name, p in hf.state_dict().items():
        assert_close(again.state_dict()[name], p, atol=0, rtol=0, msg=name)


def test_gpt_preset_exports_a_config_transformers_accepts(tmp_path: Path) -> None:
    model = attnkit.build_model("gpt-tiny").eval()
    attnkit.export_hf(model, tmp_path / "out")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out").eval()
    ids = torch.randint(0, 1000, (2, 9))
    with torch.no_grad():
        assert_close(hf(ids).logits, model(ids).logits, atol=1e-5, rtol=1e-5)


def test_gpt2_unsupported_option_is_refused(tmp_path: Path) -> None:
    hf = hf_gpt2(0)
    hf.config.scale_attn_by_inverse_layer_idx = True
    hf.save_pretrained(tmp_path / "hf")
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx"):
        attnkit.from_pretrained(tmp_path / "hf")


def test_sharded_checkpoints_load_whole_and_export_sharded(tmp_path: Path) -> None:
    """transformers' max_shard_size layout in (every shard checked) and out, equal logits."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=101, n_embd=32, n_head=4, n_layer=3, n_positions=40)
    hf = transformers.GPT2LMHeadModel(config).eval()
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    shards = sorted(p.name for p in (tmp_path / "sharded").glob("model-*.safetensors"))
    assert len(shards) > 2 and not (tmp_path / "sharded" / "model.safetensors").exists()
    model = attnkit.from_pretrained(tmp_path / "sharded")
    ids = torch.randint(0, 101, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert_close(model(ids).logits, hf(ids).logits, atol=1e-5, rtol=1e-5)
    attnkit.export_hf(model, tmp_path / "out", max_shard_bytes=20_000)
    assert len(list((tmp_path / "out").glob("model-*-of-*.safetensors"))) > 2
    back = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        assert_close(back(ids).logits, hf(ids).logits, atol=1e-5, rtol=1e-5)
    # A missing shard, and a shard that does not hold what the index says: one clear error each.
    broken = tmp_path / "sharded"
    (broken / shards[1]).rename(tmp_path / "away.safetensors")
    with pytest.raises(FileNotFoundError, match=f"names the shard '{shards[1]}', which is not in"):
        attnkit.from_pretrained(broken)
    (tmp_path / "away.safetensors").rename(broken / shards[1])
    (broken / shards[1]).write_bytes((broken / shards[0]).read_bytes())
    with pytest.raises(ValueError, match=r"does not hold what model\.safetensors\.index\.json says"):
        attnkit.from_pretrained(broken)
