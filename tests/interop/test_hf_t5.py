"""T5 exchange with Hugging Face: transformers' T5ForConditionalGeneration and attnkit's T5
give the same encoder output, decoder hidden state and logits, both ways, for v1.0 (ReLU,
tied and scaled head) and v1.1 (gated GELU, untied head), on padded batches."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import attnkit
from attnkit.config import PRESETS, preset
from attnkit.interop.hf import t5

transformers = pytest.importorskip("transformers")

VOCAB = 100
# (feed_forward_proj, tie_word_embeddings, num_decoder_layers, head kept untied in transformers)
CASES = {
    "v1.0": ("relu", True, 2, False),
    "v1.1": ("gated-gelu", False, 2, True),
    # transformers 5 ties even a v1.1 head unless told otherwise and then writes no lm_head.weight
    "v1.1-deeper-decoder-tied": ("gated-gelu", False, 3, False),
    "gated-silu": ("gated-silu", True, 3, False),
}


def hf_model(case: str) -> transformers.T5ForConditionalGeneration:
    proj, tie, n_dec, untie = CASES[case]
    config = transformers.T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=n_dec,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=20,
        dropout_rate=0.0,
        feed_forward_proj=proj,
        tie_word_embeddings=tie,
        decoder_start_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "relative_attention_bias" in name:
                p.mul_(8.0)  # make the position bias matter, so a wrong bucket shows
    if untie:
        model.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, 32, generator=torch.Generator().manual_seed(1)))
    return model.eval()


def padded_batch() -> dict[str, torch.Tensor]:
    """Sources of 25, 18 and 7 tokens and targets of 22, 15 and 3, padded at the end."""
    g = torch.Generator().manual_seed(2)
    src, tgt = torch.randint(2, VOCAB, (3, 25), generator=g), torch.randint(2, VOCAB, (3, 22), generator=g)
    src_mask, tgt_mask = torch.ones_like(src), torch.ones_like(tgt)
    for i, (s, t) in enumerate(((25, 22), (18, 15), (7, 3))):
        src_mask[i, s:], tgt_mask[i, t:] = 0, 0
    tgt[:, 0] = 0  # decoder_start_token_id
    return {
        "input_ids": src.masked_fill(src_mask == 0, 0),
        "attention_mask": src_mask,
        "decoder_input_ids": tgt.masked_fill(tgt_mask == 0, 0),
        "decoder_attention_mask": tgt_mask,
    }


@torch.no_grad()
def hf_outputs(model: transformers.T5ForConditionalGeneration, batch: dict[str, torch.Tensor]) -> dict:
    out = model(**batch)
    decoder = model.decoder(
        input_ids=batch["decoder_input_ids"],
        attention_mask=batch["decoder_attention_mask"],
        encoder_hidden_states=out.encoder_last_hidden_state,
        encoder_attention_mask=batch["attention_mask"],
    )
    return {"encoder": out.encoder_last_hidden_state, "decoder": decoder.last_hidden_state, "logits": out.logits}


@torch.no_grad()
def our_outputs(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict:
    out = model(**batch)
    return {"encoder": out.encoder_last_hidden_state, "decoder": out.last_hidden_state, "logits": out.logits}


def assert_same(ours: dict, theirs: dict, batch: dict[str, torch.Tensor]) -> None:
    """Equal at the real (unpadded) positions in fp32: hidden states to 1e-5; logits, which reach
    ±35 with N(0, 1) head weights, to 4e-5. All the difference comes from transformers writing
    gelu_new out where attnkit calls torch's tanh GELU (with torch's, the outputs are bit-equal)."""
    real = {"encoder": batch["attention_mask"].bool(), "decoder": batch["decoder_attention_mask"].bool()}
    real["logits"] = real["decoder"]
    for key, mask in real.items():
        atol = 4e-5 if key == "logits" else 1e-5
        torch.testing.assert_close(ours[key][mask], theirs[key][mask], atol=atol, rtol=1.3e-6, msg=key)


@pytest.mark.parametrize("case", list(CASES))
def test_load_and_export_match_transformers(case, tmp_path):
    proj, tie, n_dec, untie = CASES[case]
    hf = hf_model(case)
    hf.save_pretrained(tmp_path / "hf")
    assert ("lm_head.weight" in load_file(tmp_path / "hf" / "model.safetensors")) is untie
    model = attnkit.from_pretrained(tmp_path / "hf")
    cfg = model.config
    assert (cfg.family, cfg.d_k, cfg.n_layers, cfg.decoder_layers) == ("t5", 8, 2, n_dec)
    assert (cfg.relative_buckets, cfg.relative_max_distance, cfg.gated) == (8, 20, proj.startswith("gated"))
    assert cfg.head_scale is tie  # v1.0 scales, v1.1 does not
    assert cfg.tie_embeddings is not untie  # tied unless the file has an lm_head.weight of its own
    batch = padded_batch()
    expected = hf_outputs(hf, batch)
    assert_same(our_outputs(model, batch), expected, batch)

    attnkit.export_hf(model, tmp_path / "out")
    back, info = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    assert back.config.scale_decoder_outputs is tie
    reloaded = back.eval().state_dict()
    for name, tensor in hf.state_dict().items():
        assert torch.equal(reloaded[name], tensor), name
    assert_same(hf_outputs(back, batch), expected, batch)


def test_attnkit_t5_tiny_exports_to_transformers(tmp_path):
    torch.manual_seed(0)
    model = attnkit.build_model("t5-tiny").eval()
    attnkit.export_hf(model, tmp_path)
    hf, info = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    batch = padded_batch()
    assert_same(our_outputs(model, batch), hf_outputs(hf.eval(), batch), batch)


@pytest.mark.parametrize("name", [n for n in PRESETS if PRESETS[n]["family"] == "t5"])
def test_presets_export_to_a_config_transformers_accepts(name):
    cfg = preset(name)
    data = t5.config_to_hf(cfg)
    hf_config = transformers.T5Config(**data)
    assert hf_config.d_kv == cfg.d_k and hf_config.num_decoder_layers == cfg.decoder_layers
    assert hf_config.scale_decoder_outputs is cfg.head_scale
    assert json.loads(hf_config.to_json_string())["feed_forward_proj"] == data["feed_forward_proj"]
    assert t5.config_from_hf(data) == cfg


@pytest.mark.parametrize(
    ("data", "tied", "scaled"),
    [
        ({}, True, True),  # v1.0, and older transformers' default
        ({"tie_word_embeddings": False}, False, False),  # v1.1 as on the Hub
        ({"tie_word_embeddings": True, "scale_decoder_outputs": False}, False, False),  # v1.1 saved by transformers 5
        ({"tie_word_embeddings": False, "scale_decoder_outputs": True}, False, True),
    ],
)
def test_head_from_config(data, tied, scaled):
    cfg = t5.config_from_hf({"vocab_size": VOCAB, **data})
    assert (cfg.tie_embeddings, cfg.head_scale) == (tied, scaled)


def test_feed_forward_proj():
    activations = {"relu": ("relu", False), "gated-gelu": ("gelu_tanh", True), "gelu": ("gelu", False)}
    activations |= {"gated-silu": ("silu", True), "gated-gelu_new": ("gelu_tanh", True)}
    for proj, expected in activations.items():
        cfg = t5.config_from_hf({"vocab_size": VOCAB, "feed_forward_proj": proj})
        assert (cfg.activation, cfg.gated) == expected, proj
    for bad in ("tanh", "gated-tanh", "relu-gated", "gated-gelu-x"):
        with pytest.raises(ValueError, match="feed_forward_proj"):
            t5.config_from_hf({"vocab_size": VOCAB, "feed_forward_proj": bad})
    with pytest.raises(ValueError, match="gated gelu"):
        t5.config_to_hf(preset("t5-tiny", activation="gelu"))


def test_wrong_shape_names_the_key(tmp_path):
    hf_model("v1.0").save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["decoder.block.1.layer.1.EncDecAttention.k.weight"] = torch.zeros(16, 32)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"decoder\.layers\.1\.cross_attn\.w_k\.weight: shape \(16, 32\)"):
        attnkit.from_pretrained(tmp_path)


def test_leftovers_and_copies():
    cfg = t5.config_from_hf({"vocab_size": VOCAB, "d_model": 32, "d_kv": 8, "num_heads": 4, "num_layers": 1})
    ours = dict(attnkit.build_model(cfg).named_parameters())
    theirs = t5.to_hf(ours, cfg)
    shared = theirs["shared.weight"]
    extra = {
        "encoder.embed_tokens.weight": shared.clone(),  # tied copies: dropped
        "lm_head.weight": shared.clone(),
        "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight": torch.zeros(32, 4),  # unused
    }
    assert t5.to_attnkit({**theirs, **extra}, cfg).keys() == ours.keys()
    untied_head = {**theirs, "lm_head.weight": torch.ones_like(shared)}  # differs: reported, never dropped
    assert "<t5> lm_head.weight" in t5.to_attnkit(untied_head, cfg)
    untied = t5.config_from_tensors(cfg, untied_head)  # ... and unties the head when the loader asks
    assert not untied.tie_embeddings and untied.head_scale
    assert t5.to_attnkit(untied_head, untied)["head.weight"] is untied_head["lm_head.weight"]
    assert t5.config_from_tensors(cfg, {**theirs, **extra}) == cfg
    only_copy = {k: v for k, v in theirs.items() if k != "shared.weight"} | {"decoder.embed_tokens.weight": shared}
    assert t5.to_attnkit(only_copy, cfg).keys() == ours.keys()
    with pytest.raises(ValueError, match=r"encoder\.embed_tokens\.weight differs"):
        t5.to_attnkit({**theirs, "encoder.embed_tokens.weight": torch.ones_like(shared)}, cfg)
