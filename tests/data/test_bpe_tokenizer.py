"""The shared byte-level BPE: exact round trips, specials at fixed ids and never split,
deterministic training, clear errors for unusable files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from attnkit.data.specials import SPECIAL_TOKENS, Specials
from attnkit.data.tokenizer import (
    MIN_VOCAB_SIZE,
    decode,
    encode_batch,
    load_tokenizer,
    specials_of,
    train_tokenizer,
)

CORPUS = [
    "The cat sat on the mat.",
    "Le chat est assis sur le tapis.",
    "Ève était là, près de la fenêtre.",
    "Where were you when the lights went out?",
    "Nous étions à la maison, à côté du café.",
    "Attention is all you need.",
] * 20
VOCAB_SIZE = 400


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return train_tokenizer(CORPUS, vocab_size=VOCAB_SIZE)


@pytest.mark.parametrize(
    "text",
    [
        "The cat sat on the mat.",
        "Ève était là",
        "Unseen words: 日本語, naïve façade, Straße, emoji 🙂",
        "  leading spaces, two  inside, a tab\tand a\nnewline ",
    ],
)
def test_encode_then_decode_returns_the_text(tokenizer: Tokenizer, text: str) -> None:
    (ids,) = encode_batch(tokenizer, [text])
    assert decode(tokenizer, ids) == text


def test_specials_have_ids_0_to_36_in_order(tokenizer: Tokenizer) -> None:
    assert [tokenizer.id_to_token(i) for i in range(len(SPECIAL_TOKENS))] == list(SPECIAL_TOKENS)
    assert specials_of(tokenizer) == Specials(vocab_size=tokenizer.get_vocab_size())
    assert len(SPECIAL_TOKENS) == 37


def test_specials_are_never_split(tokenizer: Tokenizer) -> None:
    encoded = encode_batch(tokenizer, list(SPECIAL_TOKENS))
    assert encoded == [[i] for i in range(len(SPECIAL_TOKENS))]
    (ids,) = encode_batch(tokenizer, ["le<mask>chat<extra_id_7>"])
    assert 4 in ids and 12 in ids


def test_encode_adds_no_special_tokens(tokenizer: Tokenizer) -> None:
    for ids in encode_batch(tokenizer, CORPUS[:6]):
        assert min(ids) >= len(SPECIAL_TOKENS)


def test_decode_skips_specials_and_takes_a_tensor(tokenizer: Tokenizer) -> None:
    (ids,) = encode_batch(tokenizer, ["Ève était là"])
    assert decode(tokenizer, torch.tensor([1, *ids, 2, 0, 0])) == "Ève était là"


def test_vocabulary_is_bounded_by_vocab_size(tokenizer: Tokenizer) -> None:
    assert MIN_VOCAB_SIZE < tokenizer.get_vocab_size() <= VOCAB_SIZE


def test_same_input_gives_the_same_tokenizer(tokenizer: Tokenizer) -> None:
    assert train_tokenizer(iter(CORPUS), vocab_size=VOCAB_SIZE).to_str() == tokenizer.to_str()


def test_vocab_size_too_small_for_specials_and_bytes_is_refused() -> None:
    with pytest.raises(ValueError, match=f"vocab_size={MIN_VOCAB_SIZE - 1}.*vocab_size >= {MIN_VOCAB_SIZE}"):
        train_tokenizer(CORPUS, vocab_size=MIN_VOCAB_SIZE - 1)


def test_one_string_instead_of_a_list_is_refused(tokenizer: Tokenizer) -> None:
    with pytest.raises(TypeError, match="wrap it in a list"):
        train_tokenizer("one text", vocab_size=VOCAB_SIZE)
    with pytest.raises(TypeError, match="wrap it in a list"):
        encode_batch(tokenizer, "one text")


def test_save_then_load_gives_the_same_tokenizer(tokenizer: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    assert load_tokenizer(path).to_str() == tokenizer.to_str()


def test_load_missing_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    with pytest.raises(FileNotFoundError, match=re.escape(str(path))):
        load_tokenizer(path)


def test_load_directory_asks_for_the_file_inside(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path} is a directory")):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize("content", ["", '{"version": "1.0", "model": ', '{"not": "a tokenizer"}'])
def test_load_corrupt_file_names_the_path(tmp_path: Path, content: str) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{path} is not a tokenizer")):
        load_tokenizer(path)


def test_specials_of_names_each_missing_special() -> None:
    foreign = Tokenizer(WordLevel(vocab={"<pad>": 0, "<s>": 1, "hello": 2}, unk_token="<pad>"))
    with pytest.raises(ValueError, match="lacks the special tokens </s>, <unk>, <mask>, <extra_id_0>") as err:
        specials_of(foreign)
    assert "<pad>" not in str(err.value) and "<s>," not in str(err.value)


def test_figure_labels_read_as_text_not_bytes(tokenizer: Tokenizer) -> None:
    from attnkit.chapter.alignment import pieces

    text = "Nous étions à la maison, à côté du café."
    labels = pieces(tokenizer, tokenizer.encode(text, add_special_tokens=False).ids)
    assert "".join(labels).replace("▁", " ") == text  # no "Ã©" for "é"
    assert any("é" in label for label in labels)
    assert pieces(tokenizer, [specials_of(tokenizer).eos]) == ["</s>"]
