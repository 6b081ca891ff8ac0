"""Token-budget batches: every example once per epoch, within budget, grouped by length,
deterministic, resumable mid-epoch, and sharded disjointly over ranks."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.data.batching import TokenBatches, few_examples, pack, split_train_valid

rng = np.random.default_rng(0)
LENGTHS = rng.integers(1, 200, size=3000).tolist()
BUDGET = 2000


def padded_size(batch: list[int], lengths: list[int]) -> int:
    return max(lengths[i] for i in batch) * len(batch)


def padding_fraction(batches: list[list[int]], lengths: list[int]) -> float:
    padded = sum(padded_size(b, lengths) for b in batches)
    return 1 - sum(lengths) / padded


def assert_every_example_once(batches: list[list[int]], n: int) -> None:
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == list(range(n))


def test_every_example_appears_once_per_epoch() -> None:
    batches = TokenBatches(LENGTHS, BUDGET, seed=1)
    for epoch in range(3):
        assert_every_example_once(batches.epoch_batches(epoch), len(LENGTHS))


def test_every_batch_is_within_the_budget() -> None:
    for batch in TokenBatches(LENGTHS, BUDGET, seed=1).epoch_batches(0):
        assert padded_size(batch, LENGTHS) <= BUDGET


def test_an_example_longer_than_the_budget_gets_a_batch_of_its_own() -> None:
    lengths = [3, 50, 4, 3, 70, 5]
    batches = TokenBatches(lengths, batch_tokens=40, seed=0).epoch_batches(0)
    assert_every_example_once(batches, len(lengths))
    assert [1] in batches and [4] in batches
    assert all(padded_size(b, lengths) <= 40 for b in batches if b not in ([1], [4]))


def test_same_seed_same_batches_other_epoch_other_order() -> None:
    a, b = TokenBatches(LENGTHS, BUDGET, seed=7), TokenBatches(LENGTHS, BUDGET, seed=7)
    assert a.epoch_batches(3) == b.epoch_batches(3)
    assert a.epoch_batches(0) != a.epoch_batches(1)
    assert a.epoch_batches(0) != TokenBatches(LENGTHS, BUDGET, seed=8).epoch_batches(0)


def test_without_shuffle_every_epoch_is_the_same_and_runs_short_to_long() -> None:
    batches = TokenBatches(LENGTHS, BUDGET, seed=0, shuffle=False, bucket_width=1)
    first = batches.epoch_batches(0)
    assert first == batches.epoch_batches(5)
    assert [i for batch in first for i in batch] == sorted(range(len(LENGTHS)), key=lambda i: (LENGTHS[i], i))


def test_similar_lengths_are_batched_together() -> None:
    bucketed = TokenBatches(LENGTHS, BUDGET, seed=0).epoch_batches(0)
    random_order = pack(rng.permutation(len(LENGTHS)).tolist(), LENGTHS, BUDGET)
    assert padding_fraction(bucketed, LENGTHS) < 0.05 < 0.3 < padding_fraction(random_order, LENGTHS)


def test_lengths_in_a_batch_of_dense_data_differ_by_under_two_bucket_widths() -> None:
    for batch in TokenBatches(LENGTHS, BUDGET, seed=3, bucket_width=8).epoch_batches(0):
        spread = [LENGTHS[i] for i in batch]
        assert max(spread) - min(spread) < 16


def test_resumed_iterator_continues_with_the_same_batches() -> None:
    batches = TokenBatches(LENGTHS, BUDGET, seed=5)
    n_first_epoch = len(batches.epoch_batches(0))
    uninterrupted = iter(batches)
    stop = n_first_epoch - 10  # resume 10 batches before an epoch boundary
    for _ in range(stop):
        next(uninterrupted)
    state = uninterrupted.state_dict()
    assert state == {"epoch": 0, "batch": stop}
    resumed = iter(TokenBatches(LENGTHS, BUDGET, seed=5))
    resumed.load_state_dict(state)
    assert list(itertools.islice(resumed, 30)) == list(itertools.islice(uninterrupted, 30))
    assert resumed.state_dict() == uninterrupted.state_dict() == {"epoch": 1, "batch": 20}


def test_iteration_runs_through_epochs_in_order() -> None:
    lengths = [5, 6, 7, 20, 21]
    batches = TokenBatches(lengths, batch_tokens=21, seed=2)
    expected = batches.epoch_batches(0) + batches.epoch_batches(1) + batches.epoch_batches(2)
    assert list(itertools.islice(iter(batches), len(expected))) == expected


def test_a_position_from_other_data_is_refused() -> None:
    iterator = iter(TokenBatches(LENGTHS, BUDGET, seed=5))
    next(iterator)
    with pytest.raises(ValueError, match="past the end of epoch 2"):
        iterator.load_state_dict({"epoch": 2, "batch": 10**6})
    with pytest.raises(ValueError, match="keys epoch and batch"):
        iterator.load_state_dict({"epoch": 0})
    with pytest.raises(ValueError, match="integers >= 0"):
        iterator.load_state_dict({"epoch": -1, "batch": 0})
    assert iterator.state_dict() == {"epoch": 0, "batch": 1}


@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
def test_shards_are_disjoint_equal_in_steps_and_cover_the_epoch(world_size: int) -> None:
    batches = TokenBatches(LENGTHS, BUDGET, seed=4)
    shards = [batches.shard(rank, world_size).epoch_batches(2) for rank in range(world_size)]
    assert len({len(shard) for shard in shards}) == 1
    assert all(batch for shard in shards for batch in shard)
    assert_every_example_once([batch for shard in shards for batch in shard], len(LENGTHS))
    assert all(padded_size(batch, LENGTHS) <= BUDGET for shard in shards for batch in shard)


def test_one_step_over_ranks_is_w_consecutive_single_process_batches() -> None:
    batches = TokenBatches(LENGTHS, BUDGET, seed=4)
    single = batches.epoch_batches(0)
    world_size = next(w for w in (2, 3, 4, 5, 6, 7) if len(single) % w == 0)
    shards = [batches.shard(rank, world_size).epoch_batches(0) for rank in range(world_size)]
    for step in range(len(shards[0])):
        assert [shard[step] for shard in shards] == single[step * world_size : (step + 1) * world_size]


def test_a_shard_resumes_like_the_whole() -> None:
    shard = TokenBatches(LENGTHS, BUDGET, seed=4).shard(1, 4)
    uninterrupted = iter(shard)
    for _ in range(7):
        next(uninterrupted)
    resumed = iter(TokenBatches(LENGTHS, BUDGET, seed=4).shard(1, 4))
    resumed.load_state_dict(uninterrupted.state_dict())
    assert list(itertools.islice(resumed, 100)) == list(itertools.islice(uninterrupted, 100))


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match=r"lengths\[1\] = 0"):
        TokenBatches([3, 0, 2], 10, seed=0)
    with pytest.raises(ValueError, match="batch_tokens=0"):
        TokenBatches([3], 0, seed=0)
    with pytest.raises(ValueError, match="non-empty"):
        TokenBatches([], 10, seed=0)
    with pytest.raises(ValueError, match="rank=2 must be in"):
        TokenBatches([3, 4], 10, seed=0).shard(2, 2)
    with pytest.raises(ValueError, match="2 examples cannot give each of world_size=3"):
        TokenBatches([3, 4], 10, seed=0).shard(0, 3)


def test_a_curriculum_epoch_holds_each_short_example_once_within_budget() -> None:
    batches = TokenBatches(LENGTHS, BUDGET, seed=1, short_max=40, short_epochs=2)
    short = [i for i, n in enumerate(LENGTHS) if n <= 40]
    for epoch in range(2):
        epoch_batches = batches.epoch_batches(epoch)
        assert sorted(i for b in epoch_batches for i in b) == short
        assert all(padded_size(b, LENGTHS) <= BUDGET for b in epoch_batches)
    assert batches.epoch_batches(0) != batches.epoch_batches(1)  # shuffled anew each epoch
    assert_every_example_once(batches.epoch_batches(2), len(LENGTHS))  # then the whole data
    assert batches.epoch_batches(2) == TokenBatches(LENGTHS, BUDGET, seed=1).epoch_batches(2)


def test_a_curriculum_resumes_mid_epoch_and_shards_over_ranks() -> None:
    batches = TokenBatches(LENGTHS, BUDGET, seed=3, short_max=60, short_epochs=1)
    n_short = len(batches.epoch_batches(0))
    whole = list(itertools.islice(iter(batches), n_short + 20))
    resumed = iter(batches)
    list(itertools.islice(resumed, n_short - 5))
    again = iter(batches)
    again.load_state_dict(resumed.state_dict())
    assert list(itertools.islice(again, 25)) == whole[n_short - 5 :]
    shards = [batches.shard(r, 2).epoch_batches(0) for r in range(2)]
    assert sorted(i for s in shards for b in s for i in b) == [i for i, n in enumerate(LENGTHS) if n <= 60]
    assert len(shards[0]) == len(shards[1])


def test_a_curriculum_that_leaves_no_example_is_refused() -> None:
    with pytest.raises(ValueError, match=r"short_max=2 leaves no example .* shortest has length 3\); raise it"):
        TokenBatches([3, 4], 10, seed=0, short_max=2, short_epochs=1)
    with pytest.raises(ValueError, match="short_epochs=-1 must be >= 0"):
        TokenBatches([3, 4], 10, seed=0, short_max=3, short_epochs=-1)


def test_split_train_valid_is_deterministic_disjoint_and_complete() -> None:
    train, valid = split_train_valid(1000, 0.05, seed=3)
    assert (train, valid) == split_train_valid(1000, 0.05, seed=3)
    assert valid != split_train_valid(1000, 0.05, seed=4)[1]
    assert len(valid) == 50 and sorted(train + valid) == list(range(1000))
    assert split_train_valid(10, 0.01, seed=0)[1] != []
    assert split_train_valid(10, 0.0, seed=0) == (list(range(10)), [])
    with pytest.raises(ValueError, match="valid_fraction=1"):
        split_train_valid(10, 1, seed=0)
    with pytest.raises(ValueError, match="leave none for training"):
        split_train_valid(1, 0.5, seed=0)


lengths_strategy = st.lists(st.integers(1, 64), min_size=1, max_size=150)


@settings(max_examples=150, deadline=None)
@given(
    lengths=lengths_strategy,
    batch_tokens=st.integers(1, 400),
    seed=st.integers(0, 2**32),
    bucket_width=st.integers(1, 16),
    epoch=st.integers(0, 5),
    shuffle=st.booleans(),
)
def test_property_batches_partition_the_examples_within_budget(
    lengths: list[int], batch_tokens: int, seed: int, bucket_width: int, epoch: int, shuffle: bool
) -> None:
    batches = TokenBatches(lengths, batch_tokens, seed, shuffle=shuffle, bucket_width=bucket_width)
    epoch_batches = batches.epoch_batches(epoch)
    assert_every_example_once(epoch_batches, len(lengths))
    for batch in epoch_batches:
        assert len(batch) == 1 or padded_size(batch, lengths) <= batch_tokens
    assert epoch_batches == batches.epoch_batches(epoch)


@settings(max_examples=150, deadline=None)
@given(
    lengths=lengths_strategy,
    batch_tokens=st.integers(1, 400),
    seed=st.integers(0, 2**32),
    world_size=st.integers(1, 5),
    epoch=st.integers(0, 5),
)
def test_property_shards_partition_the_examples_in_equal_steps(
    lengths: list[int], batch_tokens: int, seed: int, world_size: int, epoch: int
) -> None:
    batches = TokenBatches(lengths, batch_tokens, seed)
    if len(lengths) < world_size:
        with pytest.raises(ValueError, match="cannot give each"):
            batches.shard(0, world_size)
        return
    n_batches = len(batches.epoch_batches(epoch))
    if -n_batches % world_size > len(lengths) - n_batches:  # nearly every batch holds a single example
        with pytest.raises(ValueError, match="raise batch_tokens"):
            batches.shard(0, world_size).epoch_batches(epoch)
        return
    shards = [batches.shard(rank, world_size).epoch_batches(epoch) for rank in range(world_size)]
    assert len({len(shard) for shard in shards}) == 1
    assert all(batch for shard in shards for batch in shard)
    assert_every_example_once([batch for shard in shards for batch in shard], len(lengths))
    for batch in (batch for shard in shards for batch in shard):
        assert len(batch) == 1 or padded_size(batch, lengths) <= batch_tokens


@settings(max_examples=60, deadline=None)
@given(
    lengths=lengths_strategy,
    batch_tokens=st.integers(1, 400),
    seed=st.integers(0, 2**32),
    stop=st.integers(0, 60),
)
def test_property_resume_anywhere_continues_identically(
    lengths: list[int], batch_tokens: int, seed: int, stop: int
) -> None:
    uninterrupted = iter(TokenBatches(lengths, batch_tokens, seed))
    for _ in range(stop):
        next(uninterrupted)
    resumed = iter(TokenBatches(lengths, batch_tokens, seed))
    resumed.load_state_dict(uninterrupted.state_dict())
    assert list(itertools.islice(resumed, 40)) == list(itertools.islice(uninterrupted, 40))


def test_ordering_buckets_by_the_other_side_cuts_its_padding_and_keeps_everything_else() -> None:
    """Pairs: the cost bounds the longer side; ``within`` (the source length) orders each
    bucket, so the source side of a batch pads less — same examples, budget and seeds."""
    pair_rng = np.random.default_rng(3)
    source = pair_rng.integers(2, 60, size=3000)
    target = source + pair_rng.integers(0, 12, size=3000)  # a target about as long, or longer
    cost = (np.maximum(source, target) + 1).tolist()
    plain = TokenBatches(cost, BUDGET, seed=1)
    ordered = TokenBatches(cost, BUDGET, seed=1, within=source.tolist())

    def source_padding(batches: list[list[int]]) -> float:
        return 1 - sum(int(source[b].sum()) for b in batches) / sum(len(b) * int(source[b].max()) for b in batches)

    for epoch in range(2):
        batches = ordered.epoch_batches(epoch)
        assert_every_example_once(batches, len(cost))
        assert all(padded_size(b, cost) <= BUDGET for b in batches)
        assert source_padding(batches) < 0.5 * source_padding(plain.epoch_batches(epoch))
    assert ordered.epoch_batches(0) == TokenBatches(cost, BUDGET, seed=1, within=source.tolist()).epoch_batches(0)
    assert ordered.epoch_batches(0) != ordered.epoch_batches(1)  # ties are still drawn anew each epoch
    with pytest.raises(ValueError, match="within has 2 numbers for 3000 examples"):
        TokenBatches(cost, BUDGET, seed=1, within=[1, 2])


@pytest.mark.parametrize("n", [0, 1, 7, 100_003])
def test_the_int32_permutation_is_numpys_draw(n: int) -> None:
    from attnkit.data.batching import permutation

    expected = np.random.default_rng([5, 2]).permutation(n)
    np.testing.assert_array_equal(permutation(np.random.default_rng([5, 2]), n), expected)


def test_the_epoch_kept_for_reuse_is_not_changed_by_a_caller() -> None:
    batches = TokenBatches(LENGTHS, BUDGET, seed=2)
    first = batches.epoch_arrays(1)
    expected = [b.tolist() for b in first]
    first[:2] = []  # padded_epoch halves batches in the list it is given
    assert batches.epoch_batches(1) == expected
    assert batches.epoch_batches(1) == TokenBatches(LENGTHS, BUDGET, seed=2).epoch_batches(1)


def test_few_examples_are_a_function_of_the_seed_alone() -> None:
    strata = np.random.default_rng(0).integers(0, 7, size=5000)
    first = few_examples(5000, 300, seed=3, strata=strata)
    np.testing.assert_array_equal(first, few_examples(5000, 300, seed=3, strata=strata.copy()))
    assert not np.array_equal(first, few_examples(5000, 300, seed=4, strata=strata))
    assert len(first) == 300 and len(np.unique(first)) == 300 and np.all(np.diff(first) > 0)
    plain = few_examples(5000, 300, seed=3)
    assert len(np.unique(plain)) == 300 and plain.max() < 5000


@pytest.mark.parametrize(("count", "seed"), [(100, 0), (100, 1), (1000, 2), (67, 5)])
def test_each_class_gets_its_share_within_one(count: int, seed: int) -> None:
    """66 classes of very unequal sizes, as the books are (Psalms has 2,461 verses, 3 John 14)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(14, 2500, size=66)
    strata = rng.permutation(np.repeat(np.arange(66), sizes))
    picked = few_examples(len(strata), count, seed, strata)
    got = Counter(strata[picked].tolist())
    share = sizes * count / len(strata)
    assert sum(got.values()) == count
    for kind in range(66):
        assert np.floor(share[kind]) <= got.get(kind, 0) <= np.ceil(share[kind])


@pytest.mark.parametrize("count", [0, 11])
def test_a_count_outside_the_split_is_refused(count: int) -> None:
    with pytest.raises(ValueError, match=rf"^{count} examples asked of a training split of 10; give 1 to 10$"):
        few_examples(10, count, seed=0)
