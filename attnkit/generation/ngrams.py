"""A decoding constraint: no n-gram twice in one output (``no_repeat_ngram_size``, as in
``transformers``' ``NoRepeatNGramLogitsProcessor`` and fairseq), the usual cure for the loops
that an under-trained translator falls into ("Voici, j'ai dit: Voici, j'ai dit: ..."): over
token ids, as ``transformers`` counts, or over the words of the text
(``no_repeat_ngram_unit="word"``), as a reader counts."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# (next-token scores (N, V), what each row has read so far (N, L): the prompt or start token
# and the new tokens, which rows take their final token now (N,) bool: the length cap ends them
# after it) -> the scores to choose from
Constraint = Callable[[Tensor, Tensor, Tensor], Tensor]


def repeated_ngram_bans(sequences: Tensor, n: int, vocab_size: int) -> Tensor:
    """Which next tokens would complete an n-gram that already occurs in each row.

    Shapes: ``sequences`` (N, L) token ids -> (N, V) bool, True = banned. A token is banned in
    row r when the row's last n - 1 tokens followed by it form one of the row's n-grams; with
    n = 1 every token of the row is banned. Rows shorter than n - 1 tokens ban nothing.
    """
    if n < 1:
        raise ValueError(f"no_repeat_ngram_size must be >= 1, got {n}")
    N, L = sequences.shape
    banned = torch.zeros(N, vocab_size, dtype=torch.bool, device=sequences.device)
    if n > L:  # not one whole n-gram yet
        return banned
    windows = sequences.unfold(1, n, 1)  # (N, L) -> (N, L - n + 1, n): every n-gram of each row
    last = sequences[:, L - n + 1 :]  # (N, n - 1): the prefix the next token would complete
    matches = (windows[:, :, :-1] == last[:, None, :]).all(dim=-1)  # (N, L - n + 1)
    rows, which = matches.nonzero(as_tuple=True)
    banned[rows, windows[rows, which, -1]] = True
    return banned


def no_repeat_ngram(n: int) -> Constraint:
    """The constraint that bans repeating an n-gram of what a row has read: banned scores
    become -inf. What it has read is the prompt (decoder-only) or the start token
    (encoder-decoder) and the new tokens, as ``transformers`` counts."""

    def constrain(scores: Tensor, sequences: Tensor, final: Tensor) -> Tensor:
        return scores.masked_fill(repeated_ngram_bans(sequences, n, scores.shape[-1]), float("-inf"))

    return constrain


# The marks a tokenizer's pieces carry where a word begins: byte-level BPE's space, newline,
# tab and carriage return (GPT-2's "Ġ", "Ċ", "ĉ", "č") and SentencePiece's "▁".
WORD_MARKS = "ĠĊĉč▁"


@dataclass(frozen=True)
class Words:
    """How a tokenizer's pieces make whitespace-separated words, per token id.

    ``text[i]``: token i's piece without its leading word marks; ``starts[i]``: it begins a word;
    ``special[i]``: an added token (start, end, padding), which ends a word and is in none;
    ``boundary`` (V,) bool: the tokens that end the word before them, word starts and specials;
    ``pieces``: the ids of each (starts a word, text) pair of the non-special tokens.
    """

    text: tuple[str, ...]
    starts: tuple[bool, ...]
    special: tuple[bool, ...]
    boundary: Tensor
    pieces: dict[tuple[bool, str], list[int]]


@functools.lru_cache(maxsize=8)  # a tokenizer hashes by identity: read once per loaded tokenizer
def words_of(tokenizer: Tokenizer, vocab_size: int) -> Words:
    """Read :class:`Words` off ``tokenizer``'s pieces for a model of ``vocab_size`` ids (ids the
    tokenizer does not have count as specials). A word-level tokenizer's every token is a word;
    one whose pieces mark no word start (WordPiece's ``##`` marks continuations instead) is
    refused."""
    from tokenizers import models

    added = set(tokenizer.get_added_tokens_decoder())
    pieces = [tokenizer.id_to_token(i) for i in range(vocab_size)]
    special = tuple(p is None or i in added for i, p in enumerate(pieces))
    whole = isinstance(tokenizer.model, models.WordLevel)  # every token a word
    starts = tuple(not s and (whole or p[:1] in WORD_MARKS) for p, s in zip(pieces, special, strict=True))
    if not any(starts):
        raise ValueError(
            "no_repeat_ngram_unit='word' finds words by the pieces' word marks ('Ġ' or '▁'), and this tokenizer's "
            "pieces have none; use no_repeat_ngram_unit='token'"
        )
    text = tuple("" if s else p.lstrip(WORD_MARKS) for p, s in zip(pieces, special, strict=True))
    boundary = torch.tensor([a or b for a, b in zip(starts, special, strict=True)])
    pieces: dict[tuple[bool, str], list[int]] = {}
    for i, (start, piece, s) in enumerate(zip(starts, text, special, strict=True)):
        if not s:
            pieces.setdefault((start, piece), []).append(i)
    return Words(text, starts, special, boundary, pieces)


def split_words(row: Sequence[int], words: Words) -> list[str]:
    """The words of token ids ``row``, the last one possibly unfinished (and then possibly
    empty): a word begins at a marked piece, or at the first piece after a special token or
    the row's start; whitespace alone (" " then " b") makes no word. These are the
    whitespace-separated words of the decoded text, except where a piece holds whitespace
    after its first character (GPT-2's ".\n"), which is not read as a word's end."""
    out: list[str] = []
    open_word = False
    for token in row:
        if words.special[token]:
            open_word = False
        elif words.starts[token] or not open_word:
            if out and out[-1] == "":
                out[-1] = words.text[token]
            else:
                out.append(words.text[token])
            open_word = True
        else:
            out[-1] += words.text[token]
    return out


def completes_a_repeat(row_words: Sequence[str], n: int) -> bool:
    """Whether ending the last word of ``row_words`` here makes its last n words an n-gram
    that occurs earlier among them."""
    last = tuple(row_words[-n:])
    return len(row_words) > n and any(tuple(row_words[i : i + n]) == last for i in range(len(row_words) - n))


def followers(row_words: Sequence[str], n: int) -> set[str]:
    """The words that, appended to ``row_words`` as a whole word, would make its last n words an
    n-gram that occurs among them: those that follow each earlier occurrence of its last n - 1."""
    context = tuple(row_words[len(row_words) - (n - 1) :])
    return {row_words[i + n - 1] for i in range(len(row_words) - n + 1) if tuple(row_words[i : i + n - 1]) == context}


def final_bans(row: Sequence[int], n: int, words: Words) -> list[int]:
    """The tokens that, as a row's final token (the length cap cuts it after), would leave its
    last word completing a repeated n-gram of words: a piece that starts a new word spelling
    one of :func:`followers`, or one that lengthens the unfinished word into one. (Ending the
    word as it is, with a special token, is :func:`no_repeat_word_ngram`'s own ban.)"""
    row_words = split_words(row, words)
    if row and not words.special[row[-1]] and row_words[-1]:  # an unfinished word: pieces differ
        unfinished = row_words[-1]
        new = [i for w in followers(row_words, n) for i in words.pieces.get((True, w), ())]
        ends = [w[len(unfinished) :] for w in followers(row_words[:-1], n) if w.startswith(unfinished)]
        return new + [i for rest in ends if rest for i in words.pieces.get((False, rest), ())]
    # no word open, or one that is only whitespace so far: any piece's text is the next word
    done = row_words[:-1] if row_words and not row_words[-1] else row_words
    return [i for w in followers(done, n) for start in (True, False) for i in words.pieces.get((start, w), ())]


def no_repeat_word_ngram(n: int, words: Words) -> Constraint:
    """The constraint that no n-gram of *words* occurs twice in a row's text, as the count of
    outputs that loop reads it (whitespace-separated words,
    :func:`attnkit.training.report.repeats_a_trigram`). Token n-grams miss a repeat whose words
    are spelt by other pieces: a text's first word has no word mark ("Et le roi" then
    " Et le roi"), and a word may be spelt by several pieces. A row whose unfinished last word
    would complete a repeated n-gram may not end that word: every piece that starts a new word,
    and every special token (the end token included), is banned; it may still lengthen the
    word into another one. A row's final token before the length cap may not leave it on a
    repeat either (:func:`final_bans`)."""
    if n < 1:
        raise ValueError(f"no_repeat_ngram_size must be >= 1, got {n}")

    def constrain(scores: Tensor, sequences: Tensor, final: Tensor) -> Tensor:
        rows = [
            r
            for r, row in enumerate(sequences.tolist())
            if not words.special[row[-1]] and completes_a_repeat(split_words(row, words), n)
        ]  # a row that ends on a special token has no unfinished word
        last = {r: final_bans(sequences[r].tolist(), n, words) for r in final.nonzero().flatten().tolist()}
        if not rows and not any(last.values()):
            return scores
        scores = scores.clone()
        scores[rows] = scores[rows].masked_fill(words.boundary.to(scores.device), float("-inf"))
        for r, tokens in last.items():
            scores[r, tokens] = float("-inf")
        return scores

    return constrain
