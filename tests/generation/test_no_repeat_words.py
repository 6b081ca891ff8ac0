"""``no_repeat_ngram_unit="word"``: the words read off a tokenizer's pieces are the decoded
text's whitespace-separated words, the repeat that token n-grams miss is caught, and no
decoding mode ends a word, or cuts a row at its length cap, on a repeated word n-gram."""

from __future__ import annotations

import random
import re
from collections.abc import Callable

import pytest
import torch
from tokenizers import Tokenizer

from attnkit.data.tokenizer import train_tokenizer
from attnkit.generation.ngrams import completes_a_repeat, final_bans, repeated_ngram_bans, split_words, words_of
from attnkit.training.report import repeats_a_trigram

TEXTS = [
    "Et le roi leur dit: Que vois-tu? Et le roi se leva.",
    "the cat sat on the mat, and the dog sat on the log.",
    "He lifted up his eyes and looked, and saw three men.",
    "Je ferai de Jerusalem un monceau de ruines.\nEt je ferai des villes un desert.",
]
ASCII_PIECE = re.compile(r"^[ĠĊ]*[!-~]*$")  # printable ASCII after its marks: decodes to itself


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return train_tokenizer(TEXTS * 4, vocab_size=420)


def test_words_are_the_decoded_texts_whitespace_split(tokenizer: Tokenizer) -> None:
    size = tokenizer.get_vocab_size()
    words = words_of(tokenizer, size)
    plain = [i for i in range(size) if not words.special[i] and ASCII_PIECE.match(tokenizer.id_to_token(i))]
    assert any(words.starts[i] for i in plain) and any(not words.starts[i] for i in plain)
    rng = random.Random(0)
    for _ in range(500):
        row = rng.choices(plain, k=rng.randrange(0, 14))
        got = split_words(row, words)
        if got and got[-1] == "":  # a row ending in whitespace: the next word has begun, empty
            got.pop()
        assert got == tokenizer.decode(row).split(), [tokenizer.id_to_token(i) for i in row]


def test_a_special_token_ends_a_word(tokenizer: Tokenizer) -> None:
    words = words_of(tokenizer, tokenizer.get_vocab_size())
    a, b = tokenizer.encode("le").ids, tokenizer.encode("roi").ids
    eos = tokenizer.token_to_id("</s>")
    assert split_words([*a, eos, *b], words) == ["le", "roi"]


def test_the_repeat_that_token_ngrams_miss_is_caught(tokenizer: Tokenizer) -> None:
    """A text's first word has no word mark, so "Et le roi ... Et le roi" repeats three words
    but no three token ids: the token bans let it through, the word check does not."""
    words = words_of(tokenizer, tokenizer.get_vocab_size())
    row = tokenizer.encode("Et le roi dit: Et le roi").ids
    assert row[0] != tokenizer.encode(" Et").ids[0]
    assert completes_a_repeat(split_words(row, words), 3)
    *before, last = row
    assert not repeated_ngram_bans(torch.tensor([before]), 3, tokenizer.get_vocab_size())[0, last]
    assert not completes_a_repeat(split_words(tokenizer.encode("Et le roi dit: Et le roy").ids, words), 3)


def test_a_final_token_never_ends_a_row_on_a_repeat(tokenizer: Tokenizer) -> None:
    """Against every token of the vocabulary: a row's final token is banned exactly when the row
    it ends would complete a repeated word 3-gram (spelt by a new word's piece, by lengthening the
    unfinished word, or after whitespace alone), on rows that repeat themselves often."""
    size = tokenizer.get_vocab_size()
    words = words_of(tokenizer, size)
    rng = random.Random(1)
    pool = [tokenizer.encode(t).ids for t in (" Et le roi", " dit:", " Et le r", " le roi", " ", " Jer", "usalem")]
    checked = 0
    for _ in range(200):
        row = [i for _ in range(rng.randrange(2, 8)) for i in rng.choice(pool)]
        if words.special[row[-1]]:
            continue
        banned = set(final_bans(row, 3, words))
        already = completes_a_repeat(split_words(row, words), 3)  # the row's own ban covers word ends
        for token in range(size):
            if words.special[token] or (already and words.starts[token]):
                continue
            repeats = completes_a_repeat(split_words([*row, token], words), 3)
            assert (token in banned) == repeats, (tokenizer.decode(row), tokenizer.id_to_token(token))
            checked += repeats
    assert checked > 20, "the rows must give repeats to ban"


def test_a_word_level_tokenizers_tokens_are_words() -> None:
    from tokenizers import models, pre_tokenizers

    words_only = Tokenizer(models.WordLevel({"[UNK]": 0, "cat": 1, "sat": 2}, unk_token="[UNK]"))
    words_only.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    assert split_words([1, 2, 1, 2], words_of(words_only, 3)) == ["cat", "sat", "cat", "sat"]


def test_wordpiece_pieces_are_refused() -> None:
    from tokenizers import models

    wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0, "cat": 1, "##s": 2}, unk_token="[UNK]"))
    with pytest.raises(ValueError, match=r"word marks .* use no_repeat_ngram_unit='token'"):
        words_of(wordpiece, 3)


@pytest.fixture
def small_choice_model(
    wide_model: Callable[..., torch.nn.Module], tokenizer: Tokenizer
) -> Callable[..., tuple[torch.nn.Module, list[list[int]]]]:
    """Random models over the tokenizer's vocabulary, with every token banned but six words'
    pieces, other pieces that spell three of them again (" c" "at" is " cat") and the end token
    (``bad_words_ids``): few choices, so their outputs repeat, not always in the same pieces."""

    def make(name: str, seed: int = 0) -> tuple[torch.nn.Module, list[list[int]]]:
        size = tokenizer.get_vocab_size()
        model = wide_model(name, seed, vocab_size=size)
        model.tokenizer = tokenizer
        keep = {
            i for w in ("the", " the", " cat", " sat", " on", " mat", " c", " s", "at") for i in tokenizer.encode(w).ids
        }
        keep.add(model.config.eos_token_id)
        return model, [[i] for i in range(size) if i not in keep]

    return make


# Seeds whose unconstrained outputs repeat words (transformer-tiny's seed 0 spells "thethethe...",
# one word).
@pytest.mark.parametrize(("name", "seed"), [("transformer-tiny", 3), ("t5-tiny", 0), ("gpt-tiny", 0)])
def test_no_decoding_mode_ends_a_repeated_word_ngram(
    name: str,
    seed: int,
    small_choice_model: Callable[..., tuple[torch.nn.Module, list[list[int]]]],
    tokenizer: Tokenizer,
) -> None:
    model, banned = small_choice_model(name, seed)
    eos = model.config.eos_token_id
    ids = torch.tensor([tokenizer.encode(t).ids[:4] for t in ("the cat sat on", "on the mat the", "sat the cat on")])
    prompt = 1 if model.config.is_encoder_decoder else ids.shape[1]

    def texts(out: torch.Tensor) -> list[tuple[str, bool]]:
        """Each row's new text, and whether it ended with the end token (not the length cap)."""
        rows = []
        for row in out[:, prompt:].tolist():
            ended = eos in row
            rows.append((tokenizer.decode(row[: row.index(eos)] if ended else row), ended))
        return rows

    free = texts(model.generate(ids, max_new_tokens=40, bad_words_ids=banned))
    assert any(repeats_a_trigram(text) for text, _ in free), "the unconstrained output must repeat itself"
    modes = [dict(num_beams=1), dict(num_beams=3, length_penalty=0.6), dict(do_sample=True, seed=0)]
    for options in modes:
        out = model.generate(
            ids, max_new_tokens=40, bad_words_ids=banned, no_repeat_ngram_size=3, no_repeat_ngram_unit="word",
            **options,
        )  # fmt: skip
        for text, _ in texts(out):  # ended by the end token or cut by the cap
            assert not repeats_a_trigram(text), (options, text)


def test_bad_word_options_are_refused(
    small_choice_model: Callable[..., tuple[torch.nn.Module, list[list[int]]]],
) -> None:
    model, _ = small_choice_model("gpt-tiny")
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match="no_repeat_ngram_unit must be 'token' or 'word', got 'words'"):
        model.generate(ids, no_repeat_ngram_size=3, no_repeat_ngram_unit="words")
    with pytest.raises(ValueError, match=r"no_repeat_ngram_size, which is not set; set both"):
        model.generate(ids, no_repeat_ngram_unit="word")
    del model.tokenizer
    with pytest.raises(ValueError, match=r"pass tokenizer= or set model\.tokenizer"):
        model.generate(ids, no_repeat_ngram_size=3, no_repeat_ngram_unit="word")
