"""Preparing a corpus for training: the run's examples read and split, the tokenizer trained
(or reused), the examples encoded once into a dataset store (:mod:`attnkit.data.store`), and
their token-budget batches.

A user's files are streamed (read line by line, three times: to count and check them, to
sample the tokenizer's text, to encode), so memory does not grow with them; the built-in
corpora are small and read in memory. A pair's ``cost`` (the positions it takes in a batch) is
what :class:`~attnkit.data.batching.TokenBatches` packs by.
"""

from __future__ import annotations

import importlib.metadata
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from attnkit.config import RunConfig
from attnkit.config.bible import language_weights
from attnkit.data import corpora, store
from attnkit.data.batching import TokenBatches, few_examples, valid_mask
from attnkit.data.files import Kind, as_paths, iter_examples, open_text, read_labeled, read_lines, read_pairs
from attnkit.data.specials import ModelSpecials, Specials
from attnkit.data.tokenizer import (
    encode_batch,
    encode_with_specials,
    fit,
    has_specials,
    load_tokenizer,
    read_as_pretrained,
    specials_of,
    train_tokenizer,
)
from attnkit.progress import ProgressReport

log = logging.getLogger(__name__)
# The fewest tokens an example must have for an objective to train on it: span corruption keeps
# one and hides one (SpanCorruption.counts). Shorter ones (a Bible's "..." for an omitted verse)
# are left out of every split, and counted in the log.
MIN_TOKENS = {"span_corruption": 2}


@dataclass
class Data:
    """A corpus prepared for a run: its tokenizer and specials, and the encoded examples."""

    tokenizer: Tokenizer
    specials: Specials | ModelSpecials | None  # None: a classifier with a pretrained model's own tokenizer
    # Token-id examples (a store's splits, or lists): list[int], (source, target) pairs, or
    # (ids, label) for classify.
    train: Sequence[Any]
    valid: Sequence[Any]
    test: Sequence[Any]  # empty for user files (their held-out part is valid)
    labels: tuple[str, ...] = ()  # classify: the label names, index = class


def cost(example: Any) -> int:
    """Padded positions an example takes in a batch (specials included)."""
    if isinstance(example, tuple) and isinstance(example[1], int):  # (ids, label): ids hold their specials
        return len(example[0])
    if isinstance(example, tuple):
        return max(len(example[0]), len(example[1])) + 1
    return len(example) + 2


def costs(examples: Sequence[Any]) -> np.ndarray:
    """(n,) :func:`cost` of every example; a store's split gives them without reading one."""
    if isinstance(examples, store.Examples):
        return examples.costs()
    return np.fromiter((cost(e) for e in examples), dtype=np.int32, count=len(examples))


def batch_positions(batch: Sequence[int], example_costs: np.ndarray) -> int:
    """The padded positions a batch of examples (indices) takes: what the token budget bounds."""
    return len(batch) * int(example_costs[np.asarray(batch)].max())


def kind_of(run: RunConfig) -> Kind:
    """What one example of the run is: a line, a (source, target) pair, or a (text, label)."""
    return "labeled" if run.objective == "classify" else "pairs" if run.objective == "translation" else "lines"


def check_corpus(run: RunConfig) -> None:
    """Refuse a corpus the run's objective cannot train on, before anything is read."""
    data, translation = run.data, run.objective == "translation"
    if run.objective == "classify":
        if data.corpus not in ("testament", "books", "files"):
            raise ValueError(
                f"classification reads text<TAB>label files or the testament or books corpus, not {data.corpus!r}"
            )
        if data.corpus == "files" and not data.path:
            raise ValueError("no training data: pass --data.path FILE of text<TAB>label lines")
        return
    if data.corpus in ("testament", "books"):
        raise ValueError(f"the {data.corpus} corpus is a classification task: train it with train.objective=classify")
    if data.corpus == "bible" and data.tasks and not translation:
        raise ValueError("data.tasks are text-to-text pairs: train them with train.objective=translation")
    if data.corpus == "numbers" and not translation:
        raise ValueError("the numbers corpus holds translation pairs; train an encoder-decoder (translation) on it")
    if data.corpus == "files" and not data.path:
        raise ValueError("no training data: pass --data.path FILE (plain text, or source<TAB>target for translation)")


def read_texts(run: RunConfig) -> corpora.Split[Any]:
    """The run's examples as text, in memory: lines, (source, target) pairs for translation,
    or (text, label) for classification, split. (Training streams a user's files instead:
    :func:`load_data`.)"""
    check_corpus(run)
    data, translation = run.data, run.objective == "translation"
    if data.corpus == "testament":
        return corpora.testament(data.source)
    if data.corpus == "books":
        return corpora.books(data.source)
    if data.corpus == "bible":
        if translation and data.tasks:
            return corpora.bible_tasks(data.tasks)
        return corpora.bible_pairs(data.source, data.target) if translation else corpora.bible_text(data.bibles)
    if data.corpus == "numbers":
        return corpora.numbers_pairs(data.numbers, data.source, data.target)
    kind = kind_of(run)
    items: list[Any] = {"labeled": read_labeled, "pairs": read_pairs, "lines": read_lines}[kind](data.path)
    _check_count(data.path, len(items), kind, {label for _, label in items} if kind == "labeled" else set())
    held = valid_mask(len(items), data.valid_fraction, run.train.seed)
    train = [e for e, h in zip(items, held, strict=True) if not h]
    return corpora.Split(train, [e for e, h in zip(items, held, strict=True) if h], [])


def _check_count(paths: Sequence[str], n: int, kind: Kind, labels: set[str]) -> None:
    if n < 2:
        raise ValueError(f"{', '.join(paths)}: fewer than 2 examples; a run needs more data")
    if kind == "labeled" and len(labels) < 2:
        raise ValueError(f"{', '.join(paths)}: every example has the same label; a classifier needs two or more")


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
    weights = language_weights(run.data.tokenizer_weights)
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


def labels_of(texts: corpora.Split[tuple[str, str]]) -> tuple[str, ...]:
    """The label names of a classification corpus, sorted; a held-out label never trained on is
    refused (a classifier cannot predict it)."""
    names = {label for _, label in texts.train}
    check_held_out_labels(names, {label for part in (texts.valid, texts.test) for _, label in part})
    return tuple(sorted(names))


def check_held_out_labels(trained: set[str], held: set[str]) -> None:
    if unseen := sorted(held - trained):
        raise ValueError(
            f"label(s) {', '.join(map(repr, unseen))} appear only in held-out examples; add training examples of them"
        )


def encode_labeled(
    tokenizer: Tokenizer, examples: list[tuple[str, str]], labels: tuple[str, ...], max_tokens: int
) -> list[tuple[list[int], int]]:
    """(ids, label index) of each example: the ids with the tokenizer's own specials ([CLS] ...
    [SEP]), cut to ``max_tokens`` keeping the last one."""
    index = {name: i for i, name in enumerate(labels)}
    cut = [fit(row, max_tokens) for row in encode_with_specials(tokenizer, [text for text, _ in examples])]
    return [(row, index[label]) for row, (_, label) in zip(cut, examples, strict=True) if row]


def encode(tokenizer: Tokenizer, examples: list[Any], max_tokens: int) -> list[Any]:
    """Token ids of text examples, truncated to leave room for the specials the objective
    adds; examples with an empty side are dropped."""
    pairs = bool(examples) and isinstance(examples[0], tuple)
    texts = [t for e in examples for t in e] if pairs else examples
    ids = [row[: max_tokens - 2] for row in encode_batch(tokenizer, texts)]
    encoded: list[Any] = list(zip(ids[0::2], ids[1::2], strict=True)) if pairs else ids
    return [e for e in encoded if (all(e) if pairs else e)]


class MemorySource:
    """A built-in corpus, read in memory (they are small), as a store reads it."""

    def __init__(self, run: RunConfig) -> None:
        texts = read_texts(run)
        self.labels = labels_of(texts) if run.objective == "classify" else ()
        train = list(texts.train) if run.objective == "classify" else weigh_tasks(run, texts.train)
        self.parts = {"train": train, "valid": texts.valid, "test": texts.test}
        self.texts = [t for t, _ in texts.train] if run.objective == "classify" else tokenizer_texts(run, texts.train)
        self.total_bytes = sum(
            len(t.encode()) for part in self.parts.values() for e in part for t in (e if isinstance(e, tuple) else [e])
        )

    def examples(self) -> Iterator[tuple[str, Any]]:
        for split, part in self.parts.items():
            for example in part:
                yield split, example

    def tokenizer_texts(self) -> Iterator[str]:
        return iter(self.texts)


class FileSource:
    """A user's files, streamed: read once to count and check every line (an unusable line
    is an error naming file:line before anything is written), split at random by the run's
    seed, then read again for the tokenizer's sample and again to encode."""

    def __init__(self, kind: Kind, paths: Sequence[str], valid_fraction: float, seed: int, progress: bool) -> None:
        self.kind, self.paths = kind, list(paths)
        self.stats = self._stats()
        self.total_bytes = sum(size for size, _ in self.stats)
        bar = progress_bar(self.total_bytes, "reading") if progress else None
        n, seen, labels = 0, 0, set()
        for example in iter_examples(kind, self.paths):
            n += 1
            seen += sum(len(t) for t in example) + 1 if isinstance(example, tuple) else len(example) + 1
            if kind == "labeled":
                labels.add(example[1])
            if bar is not None and n % 65536 == 0:
                bar.update(min(seen, self.total_bytes))
        if bar is not None:
            bar.update(self.total_bytes)
            bar.close()
        _check_count(self.paths, n, kind, labels)
        self.held = valid_mask(n, valid_fraction, seed)
        self.labels = tuple(sorted(labels))

    def _stats(self) -> list[tuple[int, int]]:
        return [(path.stat().st_size, path.stat().st_mtime_ns) for path in as_paths(self.paths)]

    def _read(self) -> Iterator[tuple[Any, bool]]:
        """(example, whether it is held out) in file order. A file that changed since it was
        counted is refused: its store would hold other text than its hash names."""
        changed = ValueError(f"{', '.join(self.paths)} changed while being prepared; run again once it is written")
        if self._stats() != self.stats:
            raise changed
        n = 0
        for example in iter_examples(self.kind, self.paths):
            if n >= len(self.held):
                raise changed
            yield example, bool(self.held[n])
            n += 1
        if n != len(self.held) or self._stats() != self.stats:
            raise changed

    def examples(self) -> Iterator[tuple[str, Any]]:
        trained, held = set(), set()
        for example, is_held in self._read():
            if self.kind == "labeled":
                (held if is_held else trained).add(example[1])
            yield ("valid" if is_held else "train"), example
        check_held_out_labels(trained, held)

    def tokenizer_texts(self) -> Iterator[str]:
        """Every k-th training example's text, k = ceil(bytes / store.TOKENIZER_SAMPLE_BYTES)."""
        every = max(1, math.ceil(self.total_bytes / store.TOKENIZER_SAMPLE_BYTES))
        train = (example for example, is_held in self._read() if not is_held)
        for i, example in enumerate(train):
            if i % every == 0:
                if self.kind == "lines":
                    yield example
                else:
                    yield from example[:1] if self.kind == "labeled" else example


def recipe_of(run: RunConfig) -> store.Recipe:
    """What the run's store is made of: its inputs (hashed) and the settings that decide its
    examples, split and trained tokenizer."""
    check_corpus(run)
    data = run.data
    if data.corpus == "files":
        for path in as_paths(data.path):  # a missing path, a directory, a binary file: the reader's own error
            open_text(path).close()
        inputs = [store.describe_input(path) for path in as_paths(data.path)]
        settings: dict[str, Any] = {"corpus": "files", "valid_fraction": data.valid_fraction, "seed": run.train.seed}
    else:
        if data.corpus == "numbers":
            inputs = [{"name": "num2words", "version": importlib.metadata.version("num2words")}]
        else:
            inputs = [store.describe_input(corpora.bible_db())]
        ignored = {"path", "tokenizer", "vocab_size", "tokenizer_weights", "max_tokens", "valid_fraction"}
        ignored |= {"curriculum_max_tokens", "curriculum_epochs", "train_examples"}  # chosen after the store
        settings = {k: v for k, v in data.__dict__.items() if k not in ignored} | {"seed": run.train.seed}
        settings = {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()}
    vocab = {"vocab_size": data.vocab_size, "tokenizer_weights": list(data.tokenizer_weights), "seed": run.train.seed}
    if run.objective == "classify":  # the classifier's family decides the specials around a text
        vocab["read_as"] = run.model.family
    return store.Recipe(kind_of(run), tuple(inputs), settings, vocab)


def source_of(run: RunConfig, progress: bool = False) -> store.Source:
    if run.data.corpus == "files":
        return FileSource(kind_of(run), run.data.path, run.data.valid_fraction, run.train.seed, progress)
    return MemorySource(run)


def prepare(run: RunConfig, tokenizer: Tokenizer | None = None, progress: bool = False) -> store.Store:
    """The run's dataset store, built where there is none (``attnkit prepare``); ``tokenizer``:
    the one to encode with (``data.tokenizer``'s when the run names one), else one trained."""
    if tokenizer is None and run.data.tokenizer:
        tokenizer = load_tokenizer(run.data.tokenizer)
    vocab_size = run.data.vocab_size

    def reads(tokenizer: Tokenizer) -> Tokenizer:  # a classifier reads a text as its pretraining did
        return read_as_pretrained(tokenizer, run.model.family) if run.objective == "classify" else tokenizer

    return store.open_or_build(
        recipe_of(run),
        lambda: source_of(run, progress),
        None if tokenizer is None else reads(tokenizer),
        lambda texts: reads(train_tokenizer(texts, vocab_size)),
        progress_bar if progress else None,
    )


PROGRESS_BYTES = 8_000_000  # a corpus smaller than this is read in a moment: no progress shown


def progress_bar(total: float, desc: str) -> Any:
    """Progress in MB, MB/s and time left, for a corpus of at least :data:`PROGRESS_BYTES`."""
    return ProgressReport(total, desc, unit="B", enabled=total >= PROGRESS_BYTES)


def held_out(run: RunConfig, split: str) -> list[Any]:
    """The run's held-out ``split`` as text (valid, or test where the corpus has one): from a
    store of its data where there is one, else read (a user's files streamed, only that
    split kept)."""
    if split not in store.SPLITS:
        raise ValueError(f"split must be one of {', '.join(store.SPLITS)}, got {split!r}")
    found = store.find_held_out(recipe_of(run))
    if found is not None and split in store.HELD_OUT:
        return store.read_held_out(found, split)
    if run.data.corpus != "files":
        return read_texts(run).get(split)
    source = FileSource(kind_of(run), run.data.path, run.data.valid_fraction, run.train.seed, progress=False)
    return [e for s, e in source.examples() if s == split]


def load_data(
    run: RunConfig, tokenizer: Tokenizer | None, specials: ModelSpecials | None = None, progress: bool = False
) -> Data:
    """The run's corpus from its dataset store (built first where there is none: the
    tokenizer trained, or ``tokenizer`` reused, and every example encoded once), its splits
    read from disk as they are used. ``specials``: a pretrained model's own ids, where its
    tokenizer is not attnkit's. ``progress``: show the reading and tokenizing."""
    prepared = prepare(run, tokenizer, progress)
    tokenizer = prepared.tokenizer
    train, valid, test = (
        at_least(prepared.examples(split, run.data.max_tokens), MIN_TOKENS.get(run.objective, 0), split)
        for split in store.SPLITS
    )
    if len(train) < 1 or len(valid) < 1:
        raise ValueError(
            "the corpus gave no usable training or validation example; check data.path and data.max_tokens"
        )
    if run.data.train_examples is not None:
        train = few(train, run.data.train_examples, run.train.seed)
    if run.objective == "classify":
        specials = specials_of(tokenizer) if has_specials(tokenizer) else None
        return Data(tokenizer, specials, train, valid, test, labels=prepared.labels)
    return Data(tokenizer, specials or specials_of(tokenizer), train, valid, test)


def at_least(examples: store.Examples, tokens: int, split: str) -> store.Examples:
    """The text examples (``lines``) of ``split`` that have ``tokens`` or more, the others left
    out and said; all of them when ``tokens`` is 0."""
    if tokens == 0:
        return examples
    kept = np.flatnonzero(examples.costs() >= tokens + 2)  # a line's cost: its tokens and two specials
    if len(kept) < len(examples):
        log.info("%s: %d of %d examples have under %d tokens and are left out", split, len(examples) - len(kept),
                 len(examples), tokens)  # fmt: skip
    return examples.take(kept)


def few(train: store.Examples, count: int, seed: int) -> store.Examples:
    """``count`` of the training examples (data.train_examples), chosen by ``seed``, each class
    in proportion where they are labelled."""
    if count > len(train):
        raise ValueError(
            f"data.train_examples={count} is more than the {len(train)} training examples there are; give at most "
            f"{len(train)}, or null for all"
        )
    return train.take(few_examples(len(train), count, seed, train.labels))


def train_batches(run: RunConfig, data: Data) -> TokenBatches:
    """The training split's token-budget batches, with the run's curriculum, if any."""
    lengths = costs(data.train)
    short_max = run.data.curriculum_max_tokens
    if short_max is not None and lengths.min() > short_max:
        raise ValueError(
            f"data.curriculum_max_tokens={short_max} leaves no training example for the curriculum (the shortest "
            f"takes {lengths.min()} positions); raise it, or set it to null for no curriculum"
        )
    if isinstance(data.train, store.Examples):
        within = data.train.within()
    elif data.train and isinstance(data.train[0], tuple) and not isinstance(data.train[0][1], int):  # pairs
        within = np.array([len(source) for source, _ in data.train])
    else:
        within = None
    return TokenBatches(
        lengths, run.train.batch_tokens, run.train.seed, short_max=short_max, short_epochs=run.data.curriculum_epochs,
        within=within,
    )  # fmt: skip
