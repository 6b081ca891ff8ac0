"""BERT's sequence-classification head: a random ``transformers``
``BertForSequenceClassification`` loads with its logits and label names, attnkit classifiers
export to one ``transformers`` loads whole, and the head (BERT's, and GPT's on its last token)
learns a separable task in seconds."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

import attnkit

transformers = pytest.importorskip("transformers")

LABELS = ("joy", "anger", "fear")


def hf_classifier(saved_random: Callable, path: Path) -> transformers.BertForSequenceClassification:
    config = transformers.BertConfig(
        vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, id2label=dict(enumerate(LABELS)), label2id={n: i for i, n in enumerate(LABELS)},
    )  # fmt: skip
    return saved_random(transformers.BertForSequenceClassification, config, path)


def batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 120, (3, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # padding
    ids[1, 6:] = 0
    types = torch.zeros_like(ids)
    types[:, 5:] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def test_loads_with_equal_logits_and_labels(tmp_path: Path, saved_random: Callable) -> None:
    reference = hf_classifier(saved_random, tmp_path / "hf")
    ours = attnkit.from_pretrained(tmp_path / "hf")
    assert ours.config.labels == LABELS and not ours.config.lm_head and ours.config.pooler
    inputs = batch()
    with torch.no_grad():
        expected = reference(**inputs).logits  # (3, labels)
    got = ours(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"]).logits
    assert got.shape == (3, len(LABELS))
    assert_close(got, expected, atol=1e-5, rtol=0)
    # Back out: transformers loads the export with the same logits and names.
    attnkit.export_hf(ours, tmp_path / "out")
    again = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "out").eval()
    assert again.config.id2label == dict(enumerate(LABELS))
    with torch.no_grad():
        assert_close(again(**inputs).logits, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("preset", "head"), [("bert-tiny", {"pooler": True}), ("gpt-tiny", {"classifier_pooling": "last"})]
)
def test_the_head_learns_a_separable_task(preset: str, head: dict) -> None:
    """Sequences holding token 7 are class 1, the others class 0: > 90% held-out accuracy. GPT's
    head reads its last token, which must attend back to wherever the 7 is (GPT-1's transfer)."""
    torch.manual_seed(0)
    cfg = attnkit.preset(preset, vocab_size=50, lm_head=False, labels=("no", "yes"), dropout=0.0, **head)
    model = attnkit.build_model(cfg)
    g = torch.Generator().manual_seed(0)

    def data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(8, 50, (n, 12), generator=g)
        labels = torch.randint(0, 2, (n,), generator=g)
        where = torch.randint(1, 12, (n,), generator=g)
        ids[labels == 1, where[labels == 1]] = 7
        ids[:, 0] = 1  # a [CLS]-like first token
        return ids, labels

    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        ids, labels = data(32)
        loss = torch.nn.functional.cross_entropy(model(ids).logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    ids, labels = data(400)
    with torch.no_grad():
        accuracy = (model.eval()(ids).logits.argmax(-1) == labels).float().mean()
    assert accuracy > 0.9, accuracy


def test_mean_pooling_reads_the_real_tokens_only() -> None:
    cfg = attnkit.preset("bert-tiny", vocab_size=50, lm_head=False, labels=("a", "b"), classifier_pooling="mean")
    model = attnkit.build_model(cfg).eval()
    ids = torch.randint(1, 50, (1, 6))
    padded = torch.cat([ids, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(1, 6), torch.zeros(1, 4)], dim=1).long()
    assert_close(model(padded, mask).logits, model(ids).logits, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="reads the pooler's output"):
        attnkit.export_hf(model, Path("/nonexistent/never-written"))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(family="t5"), "labels .* are for BERT and GPT models, not t5"),
        (dict(lm_head=True), "set lm_head=False beside labels"),
        (dict(labels=("a", "a")), "2 or more distinct, non-empty names"),
        (dict(labels=("only",)), "2 or more distinct"),
    ],
)
def test_bad_classifier_configs(changes: dict, message: str) -> None:
    base = dict(vocab_size=50, lm_head=False, labels=("a", "b"))
    with pytest.raises(ValueError, match=message):
        attnkit.preset("bert-tiny", **{**base, **changes})
