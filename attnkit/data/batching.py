"""Token-budget batching with length bucketing, as the paper's batches of "approximately
25000 source tokens and 25000 target tokens".

A batch is a list of example indices. Its padded size is ``max(cost) * len(batch)``, where
``cost`` is the per-example number the caller passes as ``lengths``:

* one sequence per example (language modelling, BERT): its length in tokens;
* a source/target pair: ``max(len(src), len(tgt))`` bounds each side's padded size by the
  budget, the paper's reading (25000 source *and* 25000 target tokens);
  ``len(src) + len(tgt)`` bounds the two sides together.

Count the special tokens the objective adds (``<s>``, ``</s>``) in the lengths.

Everything is a pure function of ``(lengths, batch_tokens, seed, epoch)``, so a run that stops
and resumes from :meth:`BatchIterator.state_dict` sees exactly the batches it would have seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np


class EpochBatches(Protocol):
    """Anything with a list of batches per epoch: :class:`TokenBatches` or a shard of one.
    ``epoch_arrays`` holds them as int32 arrays (views of one array of the epoch's order): a
    corpus of millions of examples costs 4 bytes an example, not a Python int and a list slot."""

    def epoch_arrays(self, epoch: int) -> list[Any]: ...


class TokenBatches:
    """The batches of each epoch: examples of similar length packed together, each batch's
    padded size ``max(lengths) * n_examples <= batch_tokens``.

    Each epoch orders the examples by length bucket (``length // bucket_width``), randomly
    within a bucket, packs them greedily in that order, then shuffles the order of the batches;
    the random draws come from a generator seeded by ``(seed, epoch)``. A batch is a run of
    consecutive buckets, usually one or two, so where each bucket holds a batch's worth of
    examples lengths in a batch differ by less than ``2 * bucket_width``. ``bucket_width=1``
    packs exactly sorted lengths (least padding, least variety between epochs); wider buckets
    trade a little padding for batches that differ from epoch to epoch.
    With ``shuffle=False`` (validation) ties keep index order, batches run from short to long,
    and every epoch is the same.

    ``within`` (one number per example, e.g. a pair's source length) orders the examples of a
    bucket by it, ties still as drawn: a pair's cost bounds its longer side, and the other
    side's padding is what is left. Ordering a translation corpus's buckets by source length
    took the padding of the demo's batches from 14% of the positions to 6% (the same
    arithmetic, more real tokens in it).

    An example whose length alone exceeds ``batch_tokens`` is not dropped or cut: it gets a
    batch of its own (truncate upstream if that batch would not fit in memory).

    A short-example curriculum: with ``short_max`` set, each of the first ``short_epochs``
    epochs holds only the examples of length ``<= short_max`` (each of them once), batched
    and shuffled as above; later epochs hold every example.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_tokens: int,
        seed: int,
        shuffle: bool = True,
        bucket_width: int = 8,
        short_max: int | None = None,
        short_epochs: int = 0,
        within: Sequence[int] | None = None,
    ) -> None:
        self.lengths = np.asarray(lengths, dtype=np.int32)  # 4 bytes an example: corpora of millions
        self.within = None if within is None else np.asarray(within, dtype=np.int64)
        if self.within is not None and self.within.shape != self.lengths.shape:
            raise ValueError(f"within has {self.within.size} numbers for {self.lengths.size} examples; give one each")
        if self.lengths.ndim != 1 or self.lengths.size == 0:
            raise ValueError("lengths must be a non-empty sequence of integers, one per example")
        if self.lengths.min() < 1:
            i = int(self.lengths.argmin())
            raise ValueError(
                f"lengths[{i}] = {self.lengths[i]}; every example needs length >= 1 (drop empty examples, "
                "and count the special tokens the objective adds)"
            )
        if batch_tokens < 1:
            raise ValueError(f"batch_tokens={batch_tokens} must be >= 1 (the paper used about 25000)")
        if seed < 0:
            raise ValueError(f"seed={seed} must be >= 0")
        if bucket_width < 1:
            raise ValueError(f"bucket_width={bucket_width} must be >= 1 (1 = sort by exact length)")
        if short_epochs < 0:
            raise ValueError(f"short_epochs={short_epochs} must be >= 0 (0 = no curriculum)")
        if short_max is not None and short_epochs and self.lengths.min() > short_max:
            raise ValueError(
                f"short_max={short_max} leaves no example for the curriculum (the shortest has length "
                f"{self.lengths.min()}); raise it, or set it to null for none"
            )
        self.batch_tokens = batch_tokens
        self.seed = seed
        self.short_max = short_max if short_epochs else None
        self.short_epochs = short_epochs if short_max is not None else 0
        self.shuffle = shuffle
        self.bucket_width = bucket_width
        self._last: tuple[int, list[np.ndarray]] | None = None  # the epoch made last, and its batches

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """The batches of ``epoch``, in the order they are trained on; every example once."""
        return [batch.tolist() for batch in self.epoch_arrays(epoch)]

    def epoch_arrays(self, epoch: int) -> list[np.ndarray]:
        """:meth:`epoch_batches` as int32 arrays, in a new list (the arrays of the epoch made
        last are kept: a resume and the shards ask for the same epoch more than once, and at 7 M
        examples making one takes seconds)."""
        if self._last is None or self._last[0] != epoch:
            self._last = (epoch, self._make_epoch(epoch))
        return list(self._last[1])

    def _make_epoch(self, epoch: int) -> list[np.ndarray]:
        if epoch < 0:
            raise ValueError(f"epoch={epoch} must be >= 0")
        rng = np.random.default_rng([self.seed, epoch])
        n = len(self.lengths)
        order = permutation(rng, n) if self.shuffle else np.arange(n, dtype=np.int32)
        if epoch < self.short_epochs:
            order = order[self.lengths[order] <= self.short_max]
        buckets = self.lengths[order] // self.bucket_width
        if self.within is None:
            order = order[np.argsort(buckets, kind="stable")]  # by bucket, ties as drawn
        else:  # by bucket, then by ``within``, ties as drawn
            order = order[np.lexsort((self.within[order], buckets))]
        batches = pack_arrays(order, self.lengths, self.batch_tokens)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def shard(self, rank: int, world_size: int) -> ShardedBatches:
        """Rank ``rank``'s share of every epoch, for data parallelism over ``world_size`` processes."""
        return ShardedBatches(self, rank, world_size)

    def __iter__(self) -> BatchIterator:
        return BatchIterator(self)


class ShardedBatches:
    """Rank ``r`` of ``W`` takes batches ``r, r + W, r + 2W, ...`` of each epoch's list.

    ``batch_tokens`` is thus the budget of one rank. Step ``i`` of the ``W`` ranks together
    trains on batches ``iW .. iW + W - 1``: the examples a single process with the same
    ``batch_tokens`` sees in ``W`` consecutive steps. So ``W`` ranks equal one process that
    accumulates gradients over ``W`` batches (:class:`StepBatches` with ``per_rank=W``), and
    approximate one process with ``W`` times the budget: the same number of tokens per update,
    packed into ``W`` batches instead of one.

    Every rank gets the same number of non-empty batches per epoch, as collective training
    needs: when an epoch's batch count is not a multiple of ``W``, the batches holding the most
    examples are first halved (shorter half first) until it is, and the equivalence above
    holds for that list. The ranks' batches are disjoint and together hold every example once.
    """

    def __init__(self, unsharded: TokenBatches, rank: int, world_size: int) -> None:
        if world_size < 1:
            raise ValueError(f"world_size={world_size} must be >= 1")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        n_examples = len(unsharded.lengths)
        if n_examples < world_size:
            raise ValueError(
                f"{n_examples} examples cannot give each of world_size={world_size} ranks a batch; "
                "use fewer ranks or more data"
            )
        self.unsharded = unsharded
        self.rank = rank
        self.world_size = world_size

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        """This rank's batches of ``epoch``, in order."""
        return [batch.tolist() for batch in self.epoch_arrays(epoch)]

    def epoch_arrays(self, epoch: int) -> list[np.ndarray]:
        """:meth:`epoch_batches` as int32 arrays."""
        batches = padded_epoch(
            self.unsharded, epoch, self.world_size, f"each of {self.world_size} ranks a batch at every step"
        )
        return batches[self.rank :: self.world_size]

    def __iter__(self) -> BatchIterator:
        return BatchIterator(self)


class BatchIterator:
    """Endless iteration over the epochs of ``source`` (a :class:`TokenBatches` or a shard of
    one), with a position that can be saved and restored: after ``load_state_dict(s)`` the
    iterator yields exactly what the iterator that produced ``s`` would have yielded next."""

    def __init__(self, source: EpochBatches) -> None:
        self.source = source
        self.epoch = 0
        self.batch = 0  # index of the next batch within the epoch
        self._cached: tuple[int, list[Any]] | None = None  # (epoch, its batches as arrays)

    def _batches_of(self, epoch: int) -> list[Any]:
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, self.source.epoch_arrays(epoch))
        return self._cached[1]

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> list[int]:
        if self.batch >= len(self._batches_of(self.epoch)):
            self.epoch, self.batch = self.epoch + 1, 0
        self.batch += 1
        return as_lists(self._batches_of(self.epoch)[self.batch - 1])

    def state_dict(self) -> dict[str, int]:
        """The position of the next batch: ``{"epoch": e, "batch": i}``."""
        return {"epoch": self.epoch, "batch": self.batch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a position returned by :meth:`state_dict`; a bad one changes nothing."""
        epoch, batch = read_position(state)
        n_batches = len(self._batches_of(epoch))
        if batch > n_batches:
            raise ValueError(
                f"batch={batch} is past the end of epoch {epoch} ({n_batches} batches); the position was saved "
                "with other data, batch_tokens, seed or world_size"
            )
        self.epoch, self.batch = epoch, batch


def read_position(state: dict[str, int]) -> tuple[int, int]:
    """(epoch, batch) of a saved batch position, checked: exactly those keys, integers >= 0."""
    if set(state) != {"epoch", "batch"}:
        raise ValueError(f"a batch position has the keys epoch and batch, got {sorted(state)}")
    epoch, batch = state["epoch"], state["batch"]
    if not (isinstance(epoch, int) and isinstance(batch, int) and epoch >= 0 and batch >= 0):
        raise ValueError(f"epoch and batch must be integers >= 0, got epoch={epoch!r}, batch={batch!r}")
    return epoch, batch


def as_lists(batch: Any) -> Any:
    """A batch (an array) as a list of ints, or a step's batches as a list of such lists."""
    return batch.tolist() if isinstance(batch, np.ndarray) else [b.tolist() for b in batch]


def padded_epoch(unsharded: TokenBatches, epoch: int, multiple: int, what: str) -> list[np.ndarray]:
    """The batches of ``epoch``, the ones holding the most examples halved (shorter half first)
    until their number is a multiple of ``multiple``; ``what`` says what for, in the error."""
    batches = unsharded.epoch_arrays(epoch)
    lengths = unsharded.lengths
    n_examples = sum(map(len, batches))
    needed = -len(batches) % multiple
    if needed > n_examples - len(batches):  # each halving needs a batch of two or more examples
        raise ValueError(
            f"epoch {epoch} packs {len(batches)} batches from {n_examples} examples, too few to give {what}; "
            "raise batch_tokens (most batches hold a single example) or use fewer ranks"
        )
    for _ in range(needed):
        largest = max(range(len(batches)), key=lambda i: len(batches[i]))
        by_length = batches[largest][np.argsort(lengths[batches[largest]], kind="stable")]
        half = len(by_length) // 2
        batches[largest : largest + 1] = [by_length[:half], by_length[half:]]
    return batches


class StepBatches:
    """Rank ``r``'s batches of every optimiser step, when each of ``W`` ranks trains on
    ``per_rank`` batches per step: step ``i`` takes batches ``iG .. iG + G - 1`` of the epoch's
    list (``G = W * per_rank``), and rank ``r`` the ``per_rank`` of them from ``r * per_rank``.

    What a step trains on thus depends on ``G`` alone: ``W`` ranks with ``per_rank=k`` see, step
    by step, what one process with ``per_rank=W*k`` sees, and a position saved by one resumes
    exactly in the other. The list is padded by halving as in :class:`ShardedBatches` (which is
    ``per_rank=1``), so every step has its ``G`` non-empty batches. ``epoch_batches`` returns
    one entry per step: the rank's ``per_rank`` batches.
    """

    def __init__(self, unsharded: TokenBatches, rank: int, world_size: int, per_rank: int = 1) -> None:
        if per_rank < 1:
            raise ValueError(f"per_rank={per_rank} must be >= 1")
        ShardedBatches(unsharded, rank, world_size)  # the same checks of rank and world_size
        self.group = world_size * per_rank
        if len(unsharded.lengths) < self.group:
            raise ValueError(
                f"{len(unsharded.lengths)} examples cannot fill steps of {self.group} batches ({world_size} ranks "
                f"x {per_rank} batches each); use fewer ranks or batches per step, or more data"
            )
        self.unsharded, self.rank, self.world_size, self.per_rank = unsharded, rank, world_size, per_rank

    def epoch_batches(self, epoch: int) -> list[list[list[int]]]:  # type: ignore[override]
        """This rank's batches of each step of ``epoch``, in order."""
        return [as_lists(step) for step in self.epoch_arrays(epoch)]

    def epoch_arrays(self, epoch: int) -> list[list[np.ndarray]]:  # type: ignore[override]
        """:meth:`epoch_batches` with each batch an int32 array."""
        what = f"every step its {self.group} batches ({self.world_size} ranks x {self.per_rank})"
        batches = padded_epoch(self.unsharded, epoch, self.group, what)
        first = self.rank * self.per_rank
        return [batches[i + first : i + first + self.per_rank] for i in range(0, len(batches), self.group)]

    def __iter__(self) -> StepIterator:
        return StepIterator(self)


class StepIterator(BatchIterator):
    """Endless iteration over the steps of a :class:`StepBatches`: each ``next`` gives the
    rank's batches of one step. Its position, ``{"epoch": e, "batch": b}``, counts the batches
    of the epoch's list that all ranks together have taken (``b = steps * G``), so it means the
    same at any world size. Restored where ``G`` differs, the iterator continues at the first
    step not yet begun: exactly where ``G`` divides ``b`` and the two lists agree, which they do
    up to the halvings that pad them."""

    source: StepBatches

    def __init__(self, source: StepBatches) -> None:
        super().__init__(source)  # type: ignore[arg-type]

    def __next__(self) -> list[list[int]]:  # type: ignore[override]
        return super().__next__()  # type: ignore[return-value]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch": self.batch * self.source.group}

    def load_state_dict(self, state: dict[str, int]) -> None:
        epoch, batch = read_position(state)
        unpadded = len(self.source.unsharded.epoch_arrays(epoch))
        if unpadded <= batch <= len(self.source.unsharded.lengths):  # past the unpadded list: the epoch was done
            step = len(self._batches_of(epoch))
        else:
            step = -(-batch // self.source.group)  # the first step not yet begun
        super().load_state_dict({"epoch": epoch, "batch": step})


def pack(order: Sequence[int], lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Cut ``order`` greedily into batches with ``max(lengths) * len(batch) <= batch_tokens``;
    an example longer than ``batch_tokens`` goes alone."""
    return [batch.tolist() for batch in pack_arrays(order, lengths, batch_tokens)]


def pack_arrays(order: Sequence[int], lengths: Sequence[int], batch_tokens: int) -> list[np.ndarray]:
    """:func:`pack` as int32 arrays (views of ``order``), a batch at a time in NumPy: a batch
    that starts with an example of length ``l`` holds at most ``batch_tokens // l`` of them (the
    batch's longest is at least ``l``), so its end is searched in that window alone."""
    order = np.asarray(order, dtype=np.int32)
    ordered = np.asarray(lengths, dtype=np.int64)[order]  # (n,) the lengths in packing order
    cuts, start, n = [], 0, len(order)
    while start < n:
        window = ordered[start : start + max(batch_tokens // int(ordered[start]), 1) + 1]
        padded = np.maximum.accumulate(window) * np.arange(1, len(window) + 1)  # each prefix's padded size
        over = np.flatnonzero(padded[1:] > batch_tokens)  # the first example never starts a new batch
        if not over.size:  # the window ran to the end of the order
            break
        start += int(over[0]) + 1
        cuts.append(start)
    return np.split(order, cuts)


def permutation(rng: np.random.Generator, n: int) -> np.ndarray:
    """``rng.permutation(n)`` as int32, shuffled in place: the same draw, a quarter of its memory
    at its peak (permutation(n) makes int64 indices and a shuffled copy of them)."""
    order = np.arange(n, dtype=np.int32)
    rng.shuffle(order)
    return order


def valid_mask(n: int, valid_fraction: float, seed: int) -> np.ndarray:
    """Which of ``n`` examples are held out (a bool array), as a function of ``seed`` alone:
    :func:`split_train_valid` as a mask, one byte an example for corpora of any size."""
    if not 0 <= valid_fraction < 1:
        raise ValueError(f"valid_fraction={valid_fraction} must be in [0, 1), e.g. 0.01")
    if seed < 0:
        raise ValueError(f"seed={seed} must be >= 0")
    n_valid = max(1, round(n * valid_fraction)) if valid_fraction > 0 else 0
    if n - n_valid < 1:
        raise ValueError(f"n={n} examples leave none for training with valid_fraction={valid_fraction}")
    held = np.zeros(n, dtype=bool)
    held[permutation(np.random.default_rng(seed), n)[:n_valid]] = True
    return held


def split_train_valid(n: int, valid_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Indices of ``n`` examples split at random, as a function of ``seed`` alone, into
    ``(train, valid)``, each in increasing order. ``valid`` holds ``round(n * valid_fraction)``
    examples, at least one when ``valid_fraction > 0``."""
    held = valid_mask(n, valid_fraction, seed)
    return np.flatnonzero(~held).tolist(), np.flatnonzero(held).tolist()


def few_examples(n: int, count: int, seed: int, strata: np.ndarray | None = None) -> np.ndarray:
    """``count`` of ``n`` training examples (their indices, increasing), as a function of
    ``seed`` alone: the few labels of a fine-tuning run. With ``strata`` ((n,) ints, e.g. each
    example's class), every stratum gets its share of ``count`` in proportion to its size (the
    remainders, largest first, ties in a seeded order), so that 100 of 66 books' verses hold
    each book about as often as the whole split does."""
    if not 1 <= count <= n:
        raise ValueError(f"{count} examples asked of a training split of {n}; give 1 to {n}")
    rng = np.random.default_rng(seed)
    if strata is None:
        return np.sort(permutation(rng, n)[:count])
    kinds, sizes = np.unique(strata, return_counts=True)
    take, remainder = np.divmod(sizes.astype(np.int64) * count, n)  # each stratum's share, in whole examples
    order = np.lexsort((rng.permutation(len(kinds)), -remainder))  # largest remainder first, ties by the seed
    take[order[: count - int(take.sum())]] += 1
    members = (np.flatnonzero(strata == kind) for kind in kinds)
    picked = [index[permutation(rng, size)[:k]] for index, size, k in zip(members, sizes, take, strict=True)]
    return np.sort(np.concatenate(picked))
