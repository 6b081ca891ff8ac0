"""Preparing a corpus for training: the run's texts read and split, the tokenizer trained (or
reused), the examples encoded, and their token-budget batches.

A pair's ``cost`` (the positions it takes in a batch) is what
:class:`~attnkit.data.batching.TokenBatches` packs by.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

from attnkit.config import RunConfig
from attnkit.data import corpora
from attnkit.data.batching import TokenBatches, split_train_valid
from attnkit.data.files import read_labeled, read_lines, read_pairs
from attnkit.data.specials import ModelSpecials, Specials
from attnkit.data.tokenizer import encode_batch, has_specials, load_tokenizer, specials_of, train_tokenizer


@dataclass
class Data:
    """A corpus prepared for a run: its tokenizer and specials, and the encoded examples."""

    tokenizer: Tokenizer
    specials: Specials | ModelSpecials | None  # None: a classifier with a pretrained model's own tokenizer
    train: list[Any]  # token-id examples: list[int], (source, target) pairs, or (ids, label) for classify
    valid: list[Any]
    test: list[Any]  # empty for user files (their held-out part is valid)
    labels: tuple[str, ...] = ()  # classify: the label names, index = class


def cost(example: Any) -> int:
    """Padded positions an example takes in a batch (specials included)."""
    if isinstance(example, tuple) and isinstance(example[1], int):  # (ids, label): ids hold their specials
        return len(example[0])
    if isinstance(example, tuple):
        return max(len(example[0]), len(example[1])) + 1
    return len(example) + 2


def batch_positions(batch: list[int], examples: list[Any]) -> int:
    """The padded positions a batch of ``examples`` (indices) takes: what the token budget bounds."""
    return len(batch) * max(cost(examples[i]) for i in batch)


def read_texts(run: RunConfig) -> corpora.Split[Any]:
    """The run's examples as text: lines, or (source, target) pairs for translation, split."""
    data, translation = run.data, run.objective == "translation"
    if run.objective == "classify":
        return _labeled(run)
    if data.corpus == "testament":
        raise ValueError("the testament corpus is a classification task: train it with train.objective=classify")
    if data.corpus == "bible":
        if translation and data.tasks:
            return corpora.bible_tasks(data.tasks)
        if data.tasks:
            raise ValueError("data.tasks are text-to-text pairs: train them with train.objective=translation")
        return corpora.bible_pairs(data.source, data.target) if translation else corpora.bible_text(data.bibles)
    if data.corpus == "numbers":
        if not translation:
            raise ValueError("the numbers corpus holds translation pairs; train an encoder-decoder (translation) on it")
        return corpora.numbers_pairs(data.numbers, data.source, data.target)
    if not data.path:
        raise ValueError("no training data: pass --data.path FILE (plain text, or source<TAB>target for translation)")
    items: list[Any] = read_pairs(data.path) if translation else read_lines(data.path)
    if len(items) < 2:
        raise ValueError(f"{', '.join(data.path)}: fewer than 2 examples; a run needs more data")
    train_idx, valid_idx = split_train_valid(len(items), data.valid_fraction, run.train.seed)
    return corpora.Split([items[i] for i in train_idx], [items[i] for i in valid_idx], [])


def weigh_tasks(run: RunConfig, train: list[Any]) -> list[Any]:
    """The training pairs with each task's read as many times per epoch as data.task_weights
    says (after the tokenizer has learnt from them once each)."""
    if not run.data.task_weights:
        return train
    weight = dict(zip(run.data.tasks, run.data.task_weights, strict=True))
    return corpora.reweigh(train, lambda pair: weight[corpora.task_of(pair[0])], run.train.seed)


def tokenizer_texts(run: RunConfig, train: list[Any]) -> list[str]:
    """What the tokenizer learns from: every side of every training example, each language's
    text read as many times as data.tokenizer_weights says (the vocabulary's split between them;
    the config allows them on translation pairs only)."""
    pairs = bool(train) and isinstance(train[0], tuple)
    if not run.data.tokenizer_weights:
        return [t for e in train for t in e] if pairs else train
    weights = corpora.language_weights(run.data.tokenizer_weights)
    sides = [
        (text, language)
        for pair in train
        for text, language in zip(pair, corpora.pair_languages(pair, run.data.source, run.data.target), strict=True)
    ]
    held = {language for _, language in sides}
    if missing := sorted(set(weights) - held):
        raise ValueError(
            f"data.tokenizer_weights weigh {', '.join(missing)}, which this run's pairs do not hold (they are in "
            f"{', '.join(sorted(held))}); drop {', '.join(f'{m}=...' for m in missing)}"
        )
    return [text for text, _ in corpora.reweigh(sides, lambda side: weights.get(side[1], 1.0), run.train.seed)]


def _labeled(run: RunConfig) -> corpora.Split[tuple[str, str]]:
    """(text, label) examples: the testament task, or the run's text<TAB>label files."""
    data = run.data
    if data.corpus == "testament":
        return corpora.testament(data.source)
    if data.corpus != "files":
        raise ValueError(f"classification reads text<TAB>label files or the testament corpus, not {data.corpus!r}")
    if not data.path:
        raise ValueError("no training data: pass --data.path FILE of text<TAB>label lines")
    items = read_labeled(data.path)
    if len({label for _, label in items}) < 2:
        raise ValueError(f"{', '.join(data.path)}: every example has the same label; a classifier needs two or more")
    train_idx, valid_idx = split_train_valid(len(items), data.valid_fraction, run.train.seed)
    return corpora.Split([items[i] for i in train_idx], [items[i] for i in valid_idx], [])


def labels_of(texts: corpora.Split[tuple[str, str]]) -> tuple[str, ...]:
    """The label names of a classification corpus, sorted; a held-out label never trained on is
    refused (a classifier cannot predict it)."""
    names = tuple(sorted({label for _, label in texts.train}))
    unseen = sorted({label for part in (texts.valid, texts.test) for _, label in part} - set(names))
    if unseen:
        raise ValueError(
            f"label(s) {', '.join(map(repr, unseen))} appear only in held-out examples; add training examples of them"
        )
    return names


def encode_labeled(
    tokenizer: Tokenizer, examples: list[tuple[str, str]], labels: tuple[str, ...], max_tokens: int
) -> list[tuple[list[int], int]]:
    """(ids, label index) of each example: the ids with the tokenizer's own specials ([CLS] ...
    [SEP]), cut to ``max_tokens`` keeping the last one."""
    from attnkit.generation.text import encode as with_specials
    from attnkit.generation.text import fit

    index = {name: i for i, name in enumerate(labels)}
    cut = [fit(row, max_tokens) for row in with_specials(tokenizer, [text for text, _ in examples])]
    return [(row, index[label]) for row, (_, label) in zip(cut, examples, strict=True) if row]


def encode(tokenizer: Tokenizer, examples: list[Any], max_tokens: int) -> list[Any]:
    """Token ids of text examples, truncated to leave room for the specials the objective
    adds; examples with an empty side are dropped."""
    pairs = bool(examples) and isinstance(examples[0], tuple)
    texts = [t for e in examples for t in e] if pairs else examples
    ids = [row[: max_tokens - 2] for row in encode_batch(tokenizer, texts)]
    encoded: list[Any] = list(zip(ids[0::2], ids[1::2], strict=True)) if pairs else ids
    return [e for e in encoded if (all(e) if pairs else e)]


def load_data(run: RunConfig, tokenizer: Tokenizer | None, specials: ModelSpecials | None = None) -> Data:
    """Read the corpus, train (or reuse) the tokenizer on the training split, encode.
    ``specials``: a pretrained model's own ids, where its tokenizer is not attnkit's."""
    texts = read_texts(run)
    if tokenizer is None and run.data.tokenizer:
        tokenizer = load_tokenizer(run.data.tokenizer)
    if run.objective == "classify":
        labels = labels_of(texts)
        if tokenizer is None:
            tokenizer = train_tokenizer([text for text, _ in texts.train], run.data.vocab_size)
        parts = [
            encode_labeled(tokenizer, part, labels, run.data.max_tokens)
            for part in (texts.train, texts.valid, texts.test)
        ]
        if not parts[0] or not parts[1]:
            raise ValueError("the corpus gave no usable training or validation example; check data.path")
        specials = specials_of(tokenizer) if has_specials(tokenizer) else None
        return Data(tokenizer, specials, *parts, labels=labels)
    if tokenizer is None:  # one vocabulary for source and target, as the paper's shared BPE
        tokenizer = train_tokenizer(tokenizer_texts(run, texts.train), run.data.vocab_size)
    train, valid, test = (
        encode(tokenizer, part, run.data.max_tokens)
        for part in (weigh_tasks(run, texts.train), texts.valid, texts.test)
    )
    if len(train) < 1 or len(valid) < 1:
        raise ValueError(
            "the corpus gave no usable training or validation example; check data.path and data.max_tokens"
        )
    return Data(tokenizer, specials or specials_of(tokenizer), train, valid, test)


def train_batches(run: RunConfig, data: Data) -> TokenBatches:
    """The training split's token-budget batches, with the run's curriculum, if any."""
    lengths = [cost(e) for e in data.train]
    short_max = run.data.curriculum_max_tokens
    if short_max is not None and min(lengths) > short_max:
        raise ValueError(
            f"data.curriculum_max_tokens={short_max} leaves no training example for the curriculum (the shortest "
            f"takes {min(lengths)} positions); raise it, or set it to null for no curriculum"
        )
    pairs = bool(data.train) and isinstance(data.train[0], tuple) and not isinstance(data.train[0][1], int)
    return TokenBatches(
        lengths, run.train.batch_tokens, run.train.seed, short_max=short_max, short_epochs=run.data.curriculum_epochs,
        within=[len(source) for source, _ in data.train] if pairs else None,
    )  # fmt: skip
