"""The four families: presets, parameter counts against published figures, attnkit's own
directories (bit-exact round trip, refusal of corrupt or foreign ones), and input checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import attnkit
from attnkit.config import PRESETS, preset
from attnkit.models import build_model

TINY = ["transformer-tiny", "bert-tiny", "gpt-tiny", "t5-tiny"]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds(name: str) -> None:
    with torch.device("meta"):  # shapes only: the big presets need no memory
        model = build_model(name)
    assert model.config == preset(name)


def test_gpt2_parameter_count() -> None:
    # OpenAI's released GPT-2 "124M" (Hugging Face `gpt2`): 124,439,808 parameters with the
    # head tied to the token embedding.
    with torch.device("meta"):
        assert build_model("gpt2").num_parameters() == 124_439_808


def test_transformer_base_parameter_count() -> None:
    # Vaswani et al. 2017, Table 3: the base model has 65 × 10^6 parameters (a shared
    # source/target vocabulary of about 37,000 BPE tokens). Closed form of our assembly:
    d, d_ff, N, V = 512, 2048, 6, 37000
    attention = 4 * (d * d + d)
    ffn = d * d_ff + d_ff + d_ff * d + d
    norm = 2 * d
    encoder = N * (attention + ffn + 2 * norm)
    decoder = N * (2 * attention + ffn + 3 * norm)
    with torch.device("meta"):
        count = build_model("transformer-base").num_parameters()
    assert count == V * d + encoder + decoder
    assert abs(count - 65e6) / 65e6 < 0.05  # the paper rounds, and its vocabulary is approximate


def test_t5_small_parameter_count() -> None:
    # Raffel et al. 2020 / Hugging Face `t5-small`: 60,506,624 parameters.
    with torch.device("meta"):
        assert build_model("t5-small").num_parameters() == 60_506_624


def _inputs(name: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 1000, (2, 7), generator=g)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    kwargs = {"input_ids": ids, "attention_mask": mask}
    if name in ("transformer-tiny", "t5-tiny"):
        kwargs["decoder_input_ids"] = torch.randint(3, 1000, (2, 4), generator=g)
    return kwargs


@pytest.mark.parametrize("name", TINY)
def test_save_load_round_trip_is_bit_exact(tmp_path: Path, name: str) -> None:
    torch.manual_seed(0)
    model = build_model(name).eval()
    model.save_pretrained(tmp_path / "m")
    initialisers = dict(vars(torch.nn.init))
    loaded = attnkit.from_pretrained(tmp_path / "m")  # built without drawing random weights, then filled
    assert dict(vars(torch.nn.init)) == initialisers, "torch.nn.init left patched"
    assert loaded.config == model.config
    for (a, p), (b, q) in zip(model.named_parameters(), loaded.named_parameters(), strict=True):
        assert a == b and torch.equal(p, q), a
    with torch.no_grad():
        assert torch.equal(model(**_inputs(name)).logits, loaded(**_inputs(name)).logits)


@pytest.mark.parametrize("name", TINY)
def test_forward_shapes(name: str) -> None:
    model = build_model(name).eval()
    out = model(**_inputs(name))
    T = out.last_hidden_state.shape[1]
    assert out.last_hidden_state.shape == (2, T, model.config.d_model)
    assert out.logits.shape == (2, T, model.config.vocab_size)
    assert torch.isfinite(out.logits).all()


def test_save_refuses_to_overwrite(tmp_path: Path) -> None:
    model = build_model("gpt-tiny")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        model.save_pretrained(tmp_path / "m")
    assert (tmp_path / "m" / "notes.txt").read_text() == "mine"
    model.save_pretrained(tmp_path / "m", overwrite=True)
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    assert not list(tmp_path.glob(".m.*")), "no temporary directory is left behind"


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    build_model("gpt-tiny").save_pretrained(tmp_path / "m")
    return tmp_path / "m"


def test_truncated_weights_are_one_clear_error(saved: Path) -> None:
    weights = saved / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ValueError, match="truncated"):
        attnkit.from_pretrained(saved)


def test_missing_and_unexpected_keys_are_listed(saved: Path) -> None:
    tensors = load_file(saved / "model.safetensors")
    tensors["extra.weight"] = tensors.pop("decoder.final_norm.gamma")
    save_file(tensors, saved / "model.safetensors")
    with pytest.raises(ValueError, match=r"missing keys: decoder\.final_norm\.gamma.*unexpected keys: extra\.weight"):
        attnkit.from_pretrained(saved)


def test_wrong_architecture_is_refused(saved: Path) -> None:
    meta = json.loads((saved / "config.json").read_text())
    meta["model"]["d_model"] = 128
    (saved / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"shape \(1000, 64\) in the file, \(1000, 128\) in the config"):
        attnkit.from_pretrained(saved)


def test_non_finite_weights_are_refused(saved: Path) -> None:
    tensors = load_file(saved / "model.safetensors")
    tensors["decoder.final_norm.beta"][3] = float("nan")
    save_file(tensors, saved / "model.safetensors")
    with pytest.raises(ValueError, match=r"decoder\.final_norm\.beta: holds NaN"):
        attnkit.from_pretrained(saved)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m["model"].update(n_heads=5), "divisible by n_heads"),
        (lambda m: m["model"].update(dmodel=3), "did you mean 'd_model'"),
        (lambda m: m["model"].update(dropout="x"), "dropout must be a number"),
        (lambda m: m.update(extra=1), "unknown fields extra"),
        (lambda m: m.update(format_version=99), "format_version 99"),
    ],
)
def test_bad_config_json_is_refused(saved: Path, edit, message: str) -> None:
    meta = json.loads((saved / "config.json").read_text())
    edit(meta)
    (saved / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=message):
        attnkit.from_pretrained(saved)


GPT2_CONFIG = {"model_type": "gpt2", "vocab_size": 10, "n_embd": 8, "n_head": 2, "n_layer": 1, "n_positions": 8}


def test_pickle_only_directory_is_refused_without_unpickling(tmp_path: Path) -> None:
    sentinel = tmp_path / "pwned"
    payload = (
        b"cos\nsystem\n(S'touch " + str(sentinel).encode() + b"'\ntR."
    )  # a pickle that would run `touch` if loaded
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "pytorch_model.bin").write_bytes(payload)
    (tmp_path / "m" / "config.json").write_text(json.dumps(GPT2_CONFIG))
    with pytest.raises(ValueError, match="pickled weights"):
        attnkit.from_pretrained(tmp_path / "m")
    assert not sentinel.exists()


def test_unknown_model_type_is_refused(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(ValueError, match="model_type 'mamba'"):
        attnkit.from_pretrained(tmp_path / "m")


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (torch.tensor([[1, 2, 1000]]), "token id 1000, outside the vocabulary"),
        (torch.tensor([[-1, 2]]), "token id -1"),
        (torch.tensor([[0.5, 2.0]]), "integer tensor"),
        (torch.tensor([1, 2]), "integer tensor"),
        (torch.zeros(1, 0, dtype=torch.long), "empty"),
    ],
)
def test_bad_token_ids(ids: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_model("gpt-tiny")(ids)


def test_input_longer_than_learned_positions() -> None:
    with pytest.raises(ValueError, match="max_len=256"):
        build_model("gpt-tiny")(torch.zeros(1, 257, dtype=torch.long))


def test_encoder_decoder_needs_decoder_inputs() -> None:
    with pytest.raises(ValueError, match="decoder_input_ids is required"):
        build_model("transformer-tiny")(torch.ones(1, 3, dtype=torch.long))
