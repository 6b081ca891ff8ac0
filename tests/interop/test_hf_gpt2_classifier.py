"""GPT's sequence classifier, GPT-1's transfer: the last real token's state read by a linear
layer. A random ``transformers`` ``GPT2ForSequenceClassification`` loads with its logits and
label names, however its batch is padded; attnkit's exports to one ``transformers`` loads whole.
(That it learns a task needing the whole sequence: test_hf_bert_classifier.py, beside BERT's.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

import attnkit
from attnkit.nn.pooling import last_pool

transformers = pytest.importorskip("transformers")

LABELS = ("psalm", "law", "gospel")
PAD = 0


def hf_classifier(saved_random: Callable, path: Path) -> transformers.GPT2ForSequenceClassification:
    config = transformers.GPT2Config(
        vocab_size=120, n_embd=32, n_layer=2, n_head=4, n_positions=64, pad_token_id=PAD,
        id2label=dict(enumerate(LABELS)), label2id={n: i for i, n in enumerate(LABELS)},
    )  # fmt: skip
    return saved_random(transformers.GPT2ForSequenceClassification, config, path)


def right_padded() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, 120, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 6:], mask[2, 3:] = 0, 0
    return ids * mask, mask  # padding holds PAD (0), as transformers finds the last token by it


def test_last_pool_reads_each_rows_last_real_token_wherever_the_padding_is() -> None:
    hidden = torch.randn(3, 7, 5)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 1, 1, 0]])
    expected = torch.stack([hidden[b, max(t for t in range(7) if mask[b, t])] for b in range(3)])  # a loop's answer
    assert_close(last_pool(hidden, mask), expected, atol=0, rtol=0)


def test_loads_with_equal_logits_and_labels_and_exports_back(tmp_path: Path, saved_random: Callable) -> None:
    reference = hf_classifier(saved_random, tmp_path / "hf")
    ours = attnkit.from_pretrained(tmp_path / "hf")
    assert ours.config.labels == LABELS and not ours.config.lm_head and ours.config.classifier_pooling == "last"
    ids, mask = right_padded()
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).logits  # (3, labels)
    got = ours(ids, mask).logits
    assert got.shape == (3, len(LABELS))
    assert_close(got, expected, atol=1e-5, rtol=0)
    attnkit.export_hf(ours, tmp_path / "out")
    again = transformers.GPT2ForSequenceClassification.from_pretrained(tmp_path / "out").eval()
    assert again.config.id2label == dict(enumerate(LABELS))
    with torch.no_grad():
        assert_close(again(input_ids=ids, attention_mask=mask).logits, expected, atol=1e-5, rtol=0)


def test_a_classifier_that_pools_otherwise_does_not_export(tmp_path: Path) -> None:
    cfg = attnkit.preset("gpt-tiny", vocab_size=50, lm_head=False, labels=("a", "b"), classifier_pooling="mean")
    with pytest.raises(ValueError, match="reads the last token that is not padding; this classifier pools by 'mean'"):
        attnkit.export_hf(attnkit.build_model(cfg), tmp_path / "never")
    assert not (tmp_path / "never").exists()
    with pytest.raises(ValueError, match="its first token sees nothing but itself"):
        attnkit.preset("gpt-tiny", vocab_size=50, lm_head=False, labels=("a", "b"), classifier_pooling="cls")


def test_a_classifier_does_not_generate() -> None:
    cfg = attnkit.preset("gpt-tiny", vocab_size=50, lm_head=False, labels=("a", "b"), classifier_pooling="last")
    with pytest.raises(ValueError, match=r"^this gpt model is a classifier \(labels \['a', 'b'\]\)"):
        attnkit.build_model(cfg).generate(torch.tensor([[1, 2, 3]]), max_new_tokens=2)


def test_a_llama_shaped_classifier_has_no_llama_export(tmp_path: Path) -> None:
    cfg = attnkit.preset("llama-tiny", vocab_size=64, lm_head=False, labels=("a", "b"), classifier_pooling="last")
    with pytest.raises(ValueError, match=r"without a vocabulary head \(a classifier\) has no llama export"):
        attnkit.export_hf(attnkit.build_model(cfg), tmp_path / "never")
    assert not (tmp_path / "never").exists()
