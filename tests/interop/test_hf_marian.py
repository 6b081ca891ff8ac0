"""Marian (``model_type: marian``) <-> attnkit's Transformer: a small random ``MarianMTModel``
loads with the same encoder output, decoder states and logits on padded batches, and attnkit
Transformers export to directories ``MarianMTModel.from_pretrained`` loads whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.testing import assert_close

import attnkit
from attnkit.nn import sinusoidal_table

transformers = pytest.importorskip("transformers")

PAD = 99  # Marian's pad token is also its decoder start token
VOCAB, D_MODEL, MAX_POS = 100, 32, 64
TOL = dict(atol=1e-5, rtol=0.0)


def marian_config(**changes: object) -> transformers.MarianConfig:
    options = dict(
        vocab_size=VOCAB,
        d_model=D_MODEL,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=MAX_POS,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=PAD,
        decoder_start_token_id=PAD,
        eos_token_id=0,
        forced_eos_token_id=0,
        activation_function="swish",
        scale_embedding=True,
    )
    return transformers.MarianConfig(**{**options, **changes})


def save_marian(path: Path, seed: int = 0, **changes: object) -> Path:
    """A random MarianMTModel saved with transformers' own save_pretrained. Weights are drawn
    wider than its initialisation (std 0.02) so attention is far from uniform."""
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(marian_config(**changes)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" not in name:
                p.normal_(0.0, 0.3 if p.dim() == 2 else 0.1)
        model.final_logits_bias.normal_()
    model.save_pretrained(path)
    return path


def load_hf(path: Path, attn: str = "eager") -> transformers.MarianMTModel:
    model, info = transformers.MarianMTModel.from_pretrained(path, attn_implementation=attn, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


def batch(seed: int = 1, vocab: int = VOCAB) -> dict[str, torch.Tensor]:
    """Source and target ids with right padding in both; the targets start with the pad/start id."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(1, vocab - 1, (3, 9), generator=g)
    tgt = torch.randint(1, vocab - 1, (3, 7), generator=g)
    tgt[:, 0] = PAD if vocab == VOCAB else 1
    src_mask = torch.ones_like(src)
    src_mask[1, 6:] = src_mask[2, 3:] = 0
    tgt_mask = torch.ones_like(tgt)
    tgt_mask[0, 5:] = tgt_mask[2, 2:] = 0
    src[src_mask == 0] = tgt[tgt_mask == 0] = 0 if vocab != VOCAB else PAD
    return dict(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask)


def compare(
    ours: torch.nn.Module, hf: torch.nn.Module, inputs: dict[str, torch.Tensor], order: torch.Tensor | None = None
) -> float:
    """Encoder output, decoder states (re-indexed by ``order`` when the export permuted the
    d_model coordinates) and logits agree at every real position; returns the largest logit
    difference there."""
    with torch.no_grad():
        theirs = hf(**inputs, output_hidden_states=True)
        mine = ours(**inputs)
    src, tgt = inputs["attention_mask"].bool(), inputs["decoder_attention_mask"].bool()
    order = torch.arange(mine.last_hidden_state.shape[-1]) if order is None else order
    assert_close(mine.encoder_last_hidden_state[..., order][src], theirs.encoder_last_hidden_state[src], **TOL)
    assert_close(mine.last_hidden_state[..., order][tgt], theirs.decoder_hidden_states[-1][tgt], **TOL)
    assert_close(mine.logits[tgt], theirs.logits[tgt], **TOL)
    return float((mine.logits - theirs.logits)[tgt].abs().max())


@pytest.mark.parametrize(
    ("activation", "scale", "attn"),
    [("swish", True, "eager"), ("swish", True, "sdpa"), ("relu", False, "eager"), ("gelu", True, "sdpa")],
)
def test_marian_loads_with_same_outputs(tmp_path: Path, activation: str, scale: bool, attn: str) -> None:
    path = save_marian(tmp_path / "hf", activation_function=activation, scale_embedding=scale)
    ours = attnkit.from_pretrained(path)
    cfg = ours.config
    assert (cfg.family, cfg.positional, cfg.logits_bias, cfg.scale_embeddings) == (
        "transformer",
        "sinusoidal-halves",
        True,
        scale,
    )
    assert (cfg.pad_token_id, cfg.decoder_start_token_id, cfg.eos_token_id, cfg.max_len) == (PAD, PAD, 0, MAX_POS)
    hf = load_hf(path, attn)
    assert compare(ours, hf, batch()) < 1e-5
    assert_close(ours.head.bias, hf.final_logits_bias[0], atol=0.0, rtol=0.0)


def test_decoder_masks_match_marian_at_real_positions(tmp_path: Path) -> None:
    """Causal mask AND key padding on both sides: left-padded targets agree wherever a query
    has a key to attend (rows with none are implementation-defined in transformers)."""
    path = save_marian(tmp_path / "hf")
    ours, hf = attnkit.from_pretrained(path), load_hf(path, "eager")
    inputs = batch(seed=2)
    left = torch.ones_like(inputs["decoder_input_ids"])
    left[1, :2] = left[2, :3] = 0
    compare(ours, hf, {**inputs, "decoder_attention_mask": left})
    no_mask = {**inputs, "decoder_attention_mask": torch.ones_like(left)}
    compare(ours, hf, no_mask)


def test_incremental_decoding_matches_full_forward(tmp_path: Path) -> None:
    """Step-by-step decoding with the cache (positions offset by the cached length) gives
    Marian's full-sequence logits."""
    path = save_marian(tmp_path / "hf")
    ours, hf = attnkit.from_pretrained(path), load_hf(path)
    inputs = batch(seed=3)
    src, src_mask, tgt = inputs["input_ids"], inputs["attention_mask"], inputs["decoder_input_ids"]
    with torch.no_grad():
        full = hf(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
        memory, memory_mask = ours.encode(src, src_mask)
        cache = ours.decoder.new_cache()
        steps = [ours.decode(tgt[:, t : t + 1], memory, memory_mask, cache=cache)[1] for t in range(tgt.shape[1])]
    assert_close(torch.cat(steps, dim=1), full, **TOL)


def test_legacy_config_keys_and_stored_position_tables(tmp_path: Path) -> None:
    """Old Marian checkpoints carry BART-era config keys and the position tables: tables equal
    to the sinusoidal one (sines, then cosines) are checked and dropped; others are refused."""
    path = save_marian(tmp_path / "hf")
    data = json.loads((path / "config.json").read_text())
    legacy = dict(normalize_before=False, normalize_embedding=False, add_final_layer_norm=False, add_bias_logits=False)
    (path / "config.json").write_text(json.dumps({**data, **legacy, "static_position_embeddings": True}))
    tensors = load_file(path / "model.safetensors")
    table = sinusoidal_table(MAX_POS, D_MODEL, layout="halves")
    for side in ("encoder", "decoder"):
        tensors[f"model.{side}.embed_positions.weight"] = table.clone()
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    compare(attnkit.from_pretrained(path), load_hf(path), batch())

    tensors["model.decoder.embed_positions.weight"] = sinusoidal_table(MAX_POS, D_MODEL)  # interleaved
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"model\.decoder\.embed_positions\.weight is not the sinusoidal table"):
        attnkit.from_pretrained(path)


def test_export_round_trip(tmp_path: Path) -> None:
    """Marian -> attnkit -> export_hf -> MarianMTModel: no missing or unexpected keys, same logits."""
    path = save_marian(tmp_path / "hf", seed=4)
    ours = attnkit.from_pretrained(path)
    attnkit.export_hf(ours, tmp_path / "out")
    exported = load_hf(tmp_path / "out")
    original = load_hf(path)
    inputs = batch(seed=5)
    compare(ours, exported, inputs)
    with torch.no_grad():
        assert_close(exported(**inputs).logits, original(**inputs).logits, **TOL)
    again = attnkit.from_pretrained(tmp_path / "out")
    assert again.config == ours.config
    for (name, p), q in zip(ours.named_parameters(), again.parameters(), strict=True):
        assert torch.equal(p, q), name
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (written["activation_function"], written["decoder_start_token_id"]) == ("swish", PAD)


@pytest.mark.parametrize("positional", ["sinusoidal", "sinusoidal-halves"])
def test_transformer_tiny_exports_to_marian(tmp_path: Path, positional: str) -> None:
    """The chapter's interleaved positions are carried by permuting the residual coordinates
    (even ones first): transformers computes the halves table, the hidden states are the
    permuted ones and the logits are unchanged."""
    torch.manual_seed(6)
    model = attnkit.build_model(attnkit.preset("transformer-tiny", positional=positional, dropout=0.0)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.normal_(0.0, 0.1)  # non-trivial norms and biases, so a wrong permutation shows
            elif name == "embeddings.token.weight":
                p.mul_(4.0)
    attnkit.export_hf(model, tmp_path / "out")
    hf = load_hf(tmp_path / "out")
    inputs = batch(seed=7, vocab=model.config.vocab_size)
    d = model.config.d_model
    evens_then_odds = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)]) if positional == "sinusoidal" else None
    compare(model, hf, inputs, evens_then_odds)
    back = attnkit.from_pretrained(tmp_path / "out")
    assert back.config.positional == "sinusoidal-halves"
    compare(back, hf, inputs)
    if positional == "sinusoidal":  # the file really holds permuted coordinates
        stored = load_file(tmp_path / "out" / "model.safetensors")["model.shared.weight"]
        assert not torch.equal(stored, model.embeddings.token.weight)


def test_wrong_shape_names_the_key(tmp_path: Path) -> None:
    path = save_marian(tmp_path / "hf")
    tensors = load_file(path / "model.safetensors")
    tensors["model.encoder.layers.1.fc1.weight"] = torch.zeros(65, D_MODEL)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"model\.encoder\.layers\.1\.fc1\.weight: shape \(65, 32\)"):
        attnkit.from_pretrained(path)


def test_untied_or_leftover_tensors_are_refused(tmp_path: Path) -> None:
    path = save_marian(tmp_path / "hf")
    tensors = load_file(path / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.shared.weight"] + 1.0
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"lm_head\.weight differs from model\.shared\.weight"):
        attnkit.from_pretrained(path)
    del tensors["lm_head.weight"]
    tensors["model.encoder.layernorm_embedding.weight"] = torch.ones(D_MODEL)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"unexpected keys: <marian> model\.encoder\.layernorm_embedding\.weight"):
        attnkit.from_pretrained(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"decoder_attention_heads": 8}, "decoder_attention_heads"),
        ({"decoder_ffn_dim": 128}, "decoder_ffn_dim"),
        ({"decoder_vocab_size": 50}, "decoder_vocab_size"),
        ({"share_encoder_decoder_embeddings": False}, "share_encoder_decoder_embeddings"),
        ({"normalize_before": True}, "normalize_before"),
        ({"activation_function": "tanh"}, "activation_function"),
    ],
)
def test_unsupported_configs_are_refused(tmp_path: Path, change: dict[str, object], message: str) -> None:
    path = save_marian(tmp_path / "hf")
    data = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**data, **change}))
    with pytest.raises(ValueError, match=message):
        attnkit.from_pretrained(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"norm_first": True}, "post-LN"),
        ({"positional": "learned"}, "positional='learned'"),
        ({"tie_embeddings": False}, "ties its embeddings"),
        ({"gated": True}, "ungated"),
    ],
)
def test_export_refuses_what_marian_cannot_express(tmp_path: Path, change: dict[str, object], message: str) -> None:
    model = attnkit.build_model(attnkit.preset("transformer-tiny", **change))
    with pytest.raises(ValueError, match=message):
        attnkit.export_hf(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("overrides", [{}, {"num_beams": 1}, {"num_beams": 2, "max_new_tokens": 6}])
def test_marian_generation_config_decodes_as_transformers(tmp_path: Path, overrides: dict[str, int]) -> None:
    """Marian's defaults (bad_words_ids = [[pad]], forced_eos_token_id, num_beams, max_length)
    from its generation_config.json, with and without explicit overrides, token for token."""
    path = save_marian(tmp_path / "m")
    hf = load_hf(path)
    with torch.no_grad():
        hf.final_logits_bias[0, PAD] = 50.0  # pad would win every step, but bad_words_ids bans it
    hf.generation_config.update(
        bad_words_ids=[[PAD]], forced_eos_token_id=0, num_beams=3, max_length=9, eos_token_id=0, pad_token_id=PAD,
        decoder_start_token_id=PAD,
    )  # fmt: skip
    hf.save_pretrained(path)
    ours = attnkit.from_pretrained(path)
    assert ours.generation_defaults["bad_words_ids"] == [[PAD]]
    inputs = batch()
    expected = hf.generate(inputs["input_ids"], attention_mask=inputs["attention_mask"], **overrides)
    got = ours.generate(inputs["input_ids"], inputs["attention_mask"], **overrides)
    assert got.tolist() == expected.tolist()
    finished = (got == 0).cumsum(dim=1) > 0  # at and after each row's end token
    assert (got[:, 1:][~finished[:, 1:]] != PAD).all()  # pad is never generated, only padding after the end
    # The defaults travel on: attnkit's own directory and the exported one keep them.
    ours.save_pretrained(tmp_path / "own")
    assert (
        attnkit.from_pretrained(tmp_path / "own")
        .generate(inputs["input_ids"], inputs["attention_mask"], **overrides)
        .tolist()
        == expected.tolist()
    )
    attnkit.export_hf(ours, tmp_path / "exported")
    exported = transformers.GenerationConfig.from_pretrained(tmp_path / "exported")
    assert (exported.bad_words_ids, exported.forced_eos_token_id, exported.num_beams) == ([[PAD]], 0, 3)
    assert exported.decoder_start_token_id == PAD


def test_bad_generation_configs_are_refused_in_one_line(tmp_path: Path) -> None:
    path = save_marian(tmp_path / "m")
    (path / "generation_config.json").write_text('{"num_beams": "four"}')
    with pytest.raises(ValueError, match="num_beams must be an integer, got 'four'; fix it or delete the key"):
        attnkit.from_pretrained(path)
    (path / "generation_config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"generation_config\.json is not valid JSON"):
        attnkit.from_pretrained(path)
