"""Hostile model files. A pickle anywhere we read never runs; a corrupt safetensors file,
weights that disagree with config.json, and a bad config.json each fail as one clear line that
names the file, having loaded nothing and changed no file."""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import attnkit
from attnkit.interop.hf import export_hf
from attnkit.models import build_model
from attnkit.models.io import JSON_CAP
from attnkit.training.checkpoint import load_checkpoint, save_checkpoint

SENTINEL = "pwned"  # the file a payload creates when it is unpickled
NORM = "decoder.layers.0.add_norm_self.norm"  # two (64,) float32 tensors in gpt-tiny: gamma, beta


class Payload:
    """Unpickling this creates ``path``: the proof that a loader ran code from a file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Callable[..., object], tuple[str, str]]:
        return open, (str(self.path), "w")


def payload(kind: str, sentinel: Path) -> bytes:
    if kind == "torch.save":  # a zip archive, as pytorch_model.bin is
        path = sentinel.with_name("payload.zip")
        torch.save(Payload(sentinel), path)
        data = path.read_bytes()
        path.unlink()
        return data
    return pickle.dumps(Payload(sentinel), protocol=int(kind.removeprefix("pickle-p")))


PAYLOADS = ["pickle-p0", "pickle-p4", "torch.save"]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One of each directory we read: attnkit's own, Hugging Face's, a run's checkpoint."""
    root = tmp_path_factory.mktemp("pristine")
    model = build_model("gpt-tiny")
    model.save_pretrained(root / "m")
    export_hf(model, root / "hf")
    params = dict(model.named_parameters())
    optimizer = {
        "state": {name: {"step": torch.tensor(1.0), "exp_avg": torch.zeros_like(p)} for name, p in params.items()},
        "param_groups": [{"lr": 1e-3, "params": sorted(params)}],
    }
    save_checkpoint(root / "run", 1, model.config.to_dict(), params, optimizer, {"progress": {"step": 1}}, keep=1)
    return root


@pytest.fixture
def root(pristine: Path, tmp_path: Path) -> Path:
    shutil.copytree(pristine, tmp_path, dirs_exist_ok=True)
    return tmp_path


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every path under ``root`` with its bytes (or its kind, for what is not a regular file)."""
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else ("dir" if p.is_dir() else "other")
        for p in sorted(root.rglob("*"))
    }


def refused(root: Path, load: Callable[[], object], error: type[Exception], *fragments: str) -> None:
    """``load()`` raises ``error`` with one line holding every fragment; no file under ``root``
    changed, none appeared (the sentinel included)."""
    before = snapshot(root)
    with pytest.raises(error) as info:
        load()
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message
    assert not (root / SENTINEL).exists()
    assert snapshot(root) == before


@pytest.mark.parametrize("kind", PAYLOADS)
def test_payloads_are_live(kind: str, tmp_path: Path) -> None:
    """Loading a payload the unsafe way creates the sentinel: the tests below prove something."""
    data = payload(kind, tmp_path / SENTINEL)
    path = tmp_path / "payload"
    path.write_bytes(data)
    if kind == "torch.save":
        torch.load(path, weights_only=False)
    else:
        pickle.loads(data)
    assert (tmp_path / SENTINEL).exists()


# (directory, file the payload becomes, files removed first, what the message says)
PICKLE_PLACES = [
    ("hf", "pytorch_model.bin", ["model.safetensors"], "weights_only=True"),
    ("hf", "pytorch_model.bin", ["model.safetensors", "config.json"], "weights_only=True"),
    ("m", "model.pt", ["model.safetensors"], "safe_serialization=True"),
    ("m", "model.pth", ["model.safetensors"], "never loads"),
    ("m", "model.safetensors", [], "not safetensors"),
    ("hf", "model.safetensors", [], "not safetensors"),
    ("m", "config.json", [], "not valid JSON"),
    ("m", "tokenizer.json", [], "not a tokenizer"),
]


@pytest.mark.parametrize("kind", PAYLOADS)
@pytest.mark.parametrize(("directory", "name", "removed", "fragment"), PICKLE_PLACES)
def test_pickle_payload_in_a_model_directory_never_runs(
    root: Path, kind: str, directory: str, name: str, removed: list[str], fragment: str
) -> None:
    for other in removed:
        (root / directory / other).unlink()
    (root / directory / name).write_bytes(payload(kind, root / SENTINEL))
    refused(root, lambda: attnkit.from_pretrained(root / directory), ValueError, str(root / directory), name, fragment)


def test_pickle_renamed_to_safetensors_gets_the_conversion_hint(root: Path) -> None:
    (root / "m" / "model.safetensors").write_bytes(payload("torch.save", root / SENTINEL))
    refused(root, lambda: attnkit.from_pretrained(root / "m"), ValueError, "is a pickle", "weights_only=True")


@pytest.mark.parametrize("kind", PAYLOADS)
@pytest.mark.parametrize(
    "name", ["model.safetensors", "optimizer.safetensors", "rng.safetensors", "trainer_state.json"]
)
def test_pickle_payload_in_a_checkpoint_never_runs(root: Path, kind: str, name: str) -> None:
    checkpoint = root / "run" / "checkpoints" / "step-00000001"
    (checkpoint / name).write_bytes(payload(kind, root / SENTINEL))
    rng = torch.get_rng_state()
    refused(root, lambda: load_checkpoint(checkpoint), ValueError, str(checkpoint / name))
    assert torch.equal(torch.get_rng_state(), rng), "nothing is restored from a checkpoint that fails"


def test_a_checkpoint_loads(root: Path) -> None:
    weights, optimizer, state = load_checkpoint(root / "run" / "checkpoints" / "step-00000001")
    assert f"{NORM}.gamma" in weights and state["progress"] == {"step": 1}
    assert optimizer["state"][f"{NORM}.gamma"]["exp_avg"].shape == (64,)


def split(data: bytes) -> tuple[dict, bytes]:
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def join(header: dict | bytes, body: bytes) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + body


def edit_header(change: Callable[[dict], object]) -> Callable[[bytes], bytes]:
    def rewrite(data: bytes) -> bytes:
        header, body = split(data)
        change(header)
        return join(header, body)

    return rewrite


def norms(header: dict) -> tuple[str, str]:
    """The names of two (64,) tensors: a LayerNorm's gain and bias, whatever the naming."""
    first, second = sorted(k for k, e in header.items() if k != "__metadata__" and e["shape"] == [64])[:2]
    return first, second


def overlap(header: dict) -> None:
    first, second = norms(header)
    header[second]["data_offsets"] = header[first]["data_offsets"]


def past_the_end(header: dict) -> None:
    end = max(e["data_offsets"][1] for k, e in header.items() if k != "__metadata__")
    header[norms(header)[0]]["data_offsets"] = [end, end + 256]


def norm(**changes: object) -> Callable[[dict], None]:
    return lambda header: header[norms(header)[0]].update(changes)


SAFETENSORS_CASES = {
    "empty": (lambda d: b"", "truncated"),
    "cut in the length field": (lambda d: d[:5], "truncated"),
    "cut mid-header": (lambda d: d[:100], "truncated"),
    "cut mid-data": (lambda d: d[:-1000], "past the end"),
    "header length 2**62": (lambda d: (2**62).to_bytes(8, "little") + d[8:], "over the 100000000-byte cap"),
    "header length 200 MB": (lambda d: (200_000_000).to_bytes(8, "little") + d[8:], "over the 100000000-byte cap"),
    "header length past the end": (lambda d: (len(d)).to_bytes(8, "little") + d[8:], "truncated"),
    "header not JSON": (lambda d: join(b"\xff{not json", split(d)[1]), "not valid JSON"),
    "header a list": (lambda d: join(b"[]", split(d)[1]), "must be a JSON object"),
    "header nested 100000 deep": (lambda d: join(b"[" * 100_000 + b"]" * 100_000, split(d)[1]), "not valid JSON"),
    "header with NaN": (edit_header(lambda h: h.update(__metadata__=math.nan)), "not valid JSON"),
    "unknown dtype": (edit_header(norm(dtype="F12")), "unknown dtype 'F12'"),
    "dtype not a string": (edit_header(norm(dtype=["F32"])), "unknown dtype ['F32']"),
    "negative dimension": (edit_header(norm(shape=[-1, -64])), "not a list of non-negative integers"),
    "shape x dtype != span": (edit_header(norm(shape=[65])), "needs 260 bytes, but its data_offsets"),
    "dtype size != span": (edit_header(norm(dtype="F64")), "needs 512 bytes"),
    "offsets reversed": (edit_header(norm(data_offsets=[256, 0])), "0 <= begin <= end"),
    "offsets negative": (edit_header(norm(data_offsets=[-256, 0])), "0 <= begin <= end"),
    "offsets past the end": (edit_header(past_the_end), "past the end"),
    "offsets overlapping": (edit_header(overlap), "overlap"),
    "entry without offsets": (edit_header(lambda h: h[norms(h)[0]].pop("data_offsets")), "not {dtype"),
    "metadata not strings": (edit_header(lambda h: h.update(__metadata__={"format": 1})), "not a readable"),
    "bytes no tensor owns": (edit_header(lambda h: h.pop(norms(h)[0])), "not a readable"),
    "trailing bytes": (lambda d: d + bytes(16), "not a readable"),
}


@pytest.mark.parametrize("directory", ["m", "hf"])
@pytest.mark.parametrize("case", SAFETENSORS_CASES)
def test_corrupt_safetensors_is_one_clear_error(root: Path, directory: str, case: str) -> None:
    corrupt, fragment = SAFETENSORS_CASES[case]
    path = root / directory / "model.safetensors"
    path.write_bytes(corrupt(path.read_bytes()))
    refused(root, lambda: attnkit.from_pretrained(root / directory), ValueError, str(path), fragment)


def test_a_fifo_is_not_read(root: Path) -> None:
    """Opening a FIFO for reading would block for ever."""
    (root / "m" / "model.safetensors").unlink()
    os.mkfifo(root / "m" / "model.safetensors")
    refused(root, lambda: attnkit.from_pretrained(root / "m"), ValueError, "model.safetensors", "not a regular file")


def resave(change: Callable[[dict[str, torch.Tensor]], object]) -> Callable[[Path], None]:
    def rewrite(directory: Path) -> None:
        tensors = load_file(directory / "model.safetensors")
        change(tensors)
        save_file(tensors, directory / "model.safetensors")

    return rewrite


def poke(name: str, value: float) -> Callable[[dict[str, torch.Tensor]], None]:
    return lambda tensors: tensors[name].__setitem__(3, value)


def retype(name: str, dtype: torch.dtype) -> Callable[[dict[str, torch.Tensor]], None]:
    return lambda tensors: tensors.__setitem__(name, tensors[name].to(dtype))


def meta_edit(change: Callable[[dict], object]) -> Callable[[Path], None]:
    def rewrite(directory: Path) -> None:
        meta = json.loads((directory / "config.json").read_text())
        change(meta)
        (directory / "config.json").write_text(json.dumps(meta))

    return rewrite


def model_edit(**changes: object) -> Callable[[Path], None]:
    return meta_edit(lambda meta: meta["model"].update(changes))


WEIGHT_CASES = {
    "NaN": (resave(poke(f"{NORM}.beta", math.nan)), f"{NORM}.beta: holds NaN or Inf"),
    "+Inf": (resave(poke(f"{NORM}.gamma", math.inf)), f"{NORM}.gamma: holds NaN or Inf"),
    "-Inf": (resave(poke("embeddings.token.weight", -math.inf)), "embeddings.token.weight: holds NaN"),
    "missing key": (resave(lambda t: t.pop(f"{NORM}.beta")), f"missing keys: {NORM}.beta"),
    "extra key": (resave(lambda t: t.update(extra=torch.zeros(2))), "unexpected keys: extra"),
    "shape": (resave(lambda t: t.update({f"{NORM}.beta": torch.zeros(65)})), "shape (65,) in the file, (64,)"),
    "int64": (resave(retype(f"{NORM}.beta", torch.int64)), f"{NORM}.beta: dtype torch.int64, expected one of"),
    "bool": (resave(retype(f"{NORM}.beta", torch.bool)), "dtype torch.bool"),
    "complex": (resave(retype(f"{NORM}.beta", torch.complex64)), "dtype torch.complex64"),
    "config: d_model": (model_edit(d_model=128), "shape (1000, 64) in the file, (1000, 128) in the config"),
    "config: huge vocabulary": (model_edit(vocab_size=2**40), f"(1000, 64) in the file, ({2**40}, 64) in the config"),
    "config: more layers": (model_edit(n_layers=3), "missing keys: decoder.layers.2."),
    "config: untied head": (model_edit(tie_embeddings=False), "missing keys: head.weight"),
}


@pytest.mark.parametrize("case", WEIGHT_CASES)
def test_weights_that_disagree_with_the_config_are_refused(root: Path, case: str) -> None:
    change, fragment = WEIGHT_CASES[case]
    change(root / "m")
    refused(root, lambda: attnkit.from_pretrained(root / "m"), ValueError, "model.safetensors", fragment)


def test_half_precision_weights_load_into_float32(root: Path) -> None:
    resave(lambda t: t.update({k: v.half() for k, v in t.items()}))(root / "m")
    model = attnkit.from_pretrained(root / "m")
    assert model.embeddings.token.weight.dtype == torch.float32


def write_text(text: str) -> Callable[[Path], None]:
    return lambda directory: (directory / "config.json").write_text(text)


def oversized(directory: Path) -> None:
    with open(directory / "config.json", "r+b") as fh:
        fh.truncate(JSON_CAP + 1)  # sparse: no disk written


def directory_instead(directory: Path) -> None:
    (directory / "config.json").unlink()
    (directory / "config.json").mkdir()


CONFIG_CASES = {
    "empty": (write_text(""), ValueError, "not valid JSON"),
    "not JSON": (write_text('{"format": "attnkit",'), ValueError, "not valid JSON"),
    "not UTF-8": (lambda d: (d / "config.json").write_bytes(b"\xff\xfe{}"), ValueError, "not valid JSON"),
    "a list": (write_text("[1, 2]"), ValueError, "must hold a JSON object, got list"),
    "null": (write_text("null"), ValueError, "must hold a JSON object, got NoneType"),
    "NaN": (meta_edit(lambda m: m["model"].update(eps=math.nan)), ValueError, "NaN is not a JSON number"),
    "nested 100000 deep": (write_text("[" * 100_000 + "]" * 100_000), ValueError, "not valid JSON"),
    "oversized": (oversized, ValueError, f"over the {JSON_CAP}-byte cap"),
    "a directory": (directory_instead, ValueError, "not a regular file"),
    "missing": (lambda d: (d / "config.json").unlink(), FileNotFoundError, "not found"),
    "unknown field": (
        meta_edit(lambda m: m.update(modle={})),
        ValueError,
        "unknown fields modle (did you mean 'model'?)",
    ),
    "unknown model field": (
        model_edit(dmodel=64),
        ValueError,
        "unknown model config key 'dmodel'; did you mean 'd_model'?",
    ),
    "d_model a string": (model_edit(d_model="64"), ValueError, "d_model must be an int, got '64'"),
    "d_model a bool": (model_edit(d_model=True), ValueError, "d_model must be an int, got True"),
    "n_heads 3.5": (model_edit(n_heads=3.5), ValueError, "n_heads must be an int, got 3.5"),
    "negative size": (model_edit(n_layers=-2), ValueError, "n_layers must be a positive integer, got -2"),
    "dropout 1": (model_edit(dropout=1.0), ValueError, "dropout must be in [0, 1), got 1.0"),
    "heads not dividing": (model_edit(n_heads=5), ValueError, "d_model (64) must be divisible by n_heads (5)"),
    "unknown family": (model_edit(family="llama"), ValueError, "family must be one of"),
    "no family": (meta_edit(lambda m: m["model"].pop("family")), ValueError, "needs at least 'family'"),
    "model null": (meta_edit(lambda m: m.update(model=None)), ValueError, "must be a mapping, got NoneType"),
    "format_version": (meta_edit(lambda m: m.update(format_version="1")), ValueError, "format_version '1'"),
}


@pytest.mark.parametrize("case", CONFIG_CASES)
def test_bad_config_json_is_one_clear_error(root: Path, case: str) -> None:
    change, error, fragment = CONFIG_CASES[case]
    change(root / "m")
    refused(root, lambda: attnkit.from_pretrained(root / "m"), error, str(root / "m" / "config.json"), fragment)


HF_CONFIG_CASES = {
    "n_embd a string": ({"n_embd": "64"}, "d_model must be an int, got '64'"),
    "n_head 3.5": ({"n_head": 3.5}, "n_heads must be an int, got 3.5"),
    "n_layer negative": ({"n_layer": -1}, "n_layers must be a positive integer"),
    "heads not dividing": ({"n_head": 5}, "divisible by n_heads (5)"),
    "dropout 1": ({"resid_pdrop": 1.0}, "dropout must be in [0, 1)"),
    "n_embd missing": ({"n_embd": None}, "d_model must be an int, got None"),
}


@pytest.mark.parametrize("case", HF_CONFIG_CASES)
def test_bad_hugging_face_config_is_one_clear_error(root: Path, case: str) -> None:
    changes, fragment = HF_CONFIG_CASES[case]
    config = root / "hf" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), **changes}))
    refused(root, lambda: attnkit.from_pretrained(root / "hf"), ValueError, str(config), fragment)


def test_huge_hugging_face_config_allocates_nothing(root: Path) -> None:
    config = root / "hf" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "vocab_size": 2**40}))
    refused(root, lambda: attnkit.from_pretrained(root / "hf"), ValueError, "model.safetensors", f"({2**40}, 64)")


def test_run_directory_with_a_corrupt_checkpoint(root: Path) -> None:
    weights = root / "run" / "checkpoints" / "step-00000001" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    refused(root, lambda: attnkit.from_pretrained(root / "run"), ValueError, str(weights), "past the end")


@pytest.mark.filterwarnings("ignore:Tensor.T is deprecated")
def test_hugging_face_tensor_the_converter_cannot_split(root: Path) -> None:
    """GPT-2's fused c_attn is split in three by the converter; a 0-d one is still one clear error."""
    resave(lambda t: t.update({"transformer.h.0.attn.c_attn.weight": torch.tensor(1.0)}))(root / "hf")
    refused(root, lambda: attnkit.from_pretrained(root / "hf"), ValueError, str(root / "hf" / "model.safetensors"))
