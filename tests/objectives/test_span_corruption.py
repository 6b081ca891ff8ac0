"""T5's span corruption: noise and span counts, sentinel order, alternation starting with
non-noise, the closing sentinel, and an exact round trip."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.data.specials import Specials
from attnkit.objectives import SpanCorruption
from attnkit.objectives.span_corruption import random_segmentation

SPECIALS = Specials(vocab_size=64)
ORDINARY = sorted(set(range(64)) - SPECIALS.all)


def test_span_corruption_counts() -> None:
    objective, g = SpanCorruption(SPECIALS), torch.Generator().manual_seed(0)
    for length in range(2, 400):
        n_noise = min(max(round(length * 0.15), 1), length - 1)
        n_spans = max(1, round(n_noise / 3.0))
        assert objective.counts(length) == (n_noise, n_spans)
        inputs, targets = objective.corrupt([ORDINARY[i % len(ORDINARY)] for i in range(length)], g)
        sentinels = SPECIALS.sentinels
        assert [t for t in inputs if t in sentinels] == list(sentinels[:n_spans])  # in order, one per span
        assert [t for t in targets if t in sentinels] == list(sentinels[: n_spans + 1])  # and the closing one
        assert len(targets) - (n_spans + 2) == n_noise  # targets hold the noise tokens
        assert len(inputs) - (n_spans + 1) == length - n_noise  # inputs the others


def test_spans_alternate_starting_with_non_noise() -> None:
    objective, g = SpanCorruption(SPECIALS), torch.Generator().manual_seed(1)
    sentinels = set(SPECIALS.sentinels)
    for length in range(2, 200):
        inputs, targets = objective.corrupt(ORDINARY[:1] * length, g)
        is_sentinel = [t in sentinels for t in inputs[:-1]]
        assert not is_sentinel[0], "the text starts with a non-noise span"
        assert is_sentinel[-1], "and ends with a noise span"
        assert not any(a and b for a, b in itertools.pairwise(is_sentinel)), "non-noise spans are never empty"
        is_sentinel = [t in sentinels for t in targets[:-1]]
        assert not any(a and b for a, b in itertools.pairwise(is_sentinel)), "noise spans never empty"


def test_target_ends_with_final_sentinel_and_eos() -> None:
    inputs, targets = SpanCorruption(SPECIALS).corrupt(ORDINARY * 2, torch.Generator().manual_seed(2))
    n_spans = sum(t in SPECIALS.sentinels for t in inputs)
    assert targets[0] == SPECIALS.sentinels[0]
    assert targets[-2:] == [SPECIALS.sentinels[n_spans], SPECIALS.eos]
    assert inputs[-1] == SPECIALS.eos


@settings(max_examples=200, deadline=None)
@given(
    tokens=st.integers(2, 700).flatmap(
        lambda n: st.lists(st.sampled_from([*ORDINARY, SPECIALS.unk]), min_size=n, max_size=n)
    ),
    seed=st.integers(0, 2**32 - 1),
    density=st.sampled_from([0.15, 0.3, 0.5, 0.8]),
    mean_span=st.sampled_from([1.0, 3.0, 8.0]),
)
def test_reconstruct_inverts_corrupt(tokens: list[int], seed: int, density: float, mean_span: float) -> None:
    objective = SpanCorruption(SPECIALS, noise_density=density, mean_span_length=mean_span)
    try:
        inputs, targets = objective.corrupt(tokens, torch.Generator().manual_seed(seed))
    except ValueError as err:  # more spans than sentinels: refused, never truncated
        assert "sentinels allow at most 31" in str(err)
        return
    assert objective.reconstruct(inputs, targets) == tokens


def test_random_segmentation_is_uniform_over_compositions() -> None:
    g = torch.Generator().manual_seed(3)
    seen = Counter(tuple(random_segmentation(5, 3, g)) for _ in range(3000))
    assert set(seen) == {(1, 1, 3), (1, 3, 1), (3, 1, 1), (1, 2, 2), (2, 1, 2), (2, 2, 1)}
    # each of the 6 compositions: 500 expected, binomial sd = sqrt(3000 · 1/6 · 5/6) ≈ 20.4; 5 sd
    assert all(abs(count - 500) <= 5 * 20.4 for count in seen.values())


def test_too_many_spans_for_the_sentinels_is_refused() -> None:
    objective = SpanCorruption(SPECIALS)
    assert objective.counts(630) == (94, 31)  # 31 spans and the closing sentinel: all 32
    with pytest.raises(ValueError, match="631 tokens makes 32 noise spans, but 32 sentinels allow at most 31"):
        objective.counts(631)  # round(94.65) = 95 noise tokens, round(95 / 3) = 32 spans


def test_too_short_examples_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 2 tokens"):
        SpanCorruption(SPECIALS).corrupt([40], torch.Generator())


@pytest.mark.parametrize(
    ("inputs", "targets", "message"),
    [
        ([40, 5, 2], [5, 41, 2], "targets have no span for it"),  # no closing sentinel
        ([40, 5, 2], [6, 41, 7, 2], "where <extra_id_0> is due"),  # targets out of order
        ([40, 6, 2], [5, 41, 6, 2], "targets have no span for it"),  # inputs out of order
        ([40, 5, 2], [5, 41, 6, 42, 2], "closing sentinel"),  # tokens after the closing sentinel
        ([40, 5], [5, 41, 6, 2], "must end with eos"),
    ],
)
def test_reconstruct_refuses_malformed_pairs(inputs: list[int], targets: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SpanCorruption(SPECIALS).reconstruct(inputs, targets)


def test_batch_is_an_encoder_decoder_batch_of_the_corruption() -> None:
    examples = [ORDINARY[:20], ORDINARY[5:12]]
    batch = SpanCorruption(SPECIALS).batch(examples, torch.Generator().manual_seed(4))
    pairs = [SpanCorruption(SPECIALS).corrupt(x, torch.Generator().manual_seed(4)) for x in examples[:1]]
    inputs, targets = pairs[0]
    assert batch["input_ids"][0, : len(inputs)].tolist() == inputs
    assert batch["labels"][0, : len(targets)].tolist() == targets
    assert batch["decoder_input_ids"][0, : len(targets)].tolist() == [SPECIALS.bos, *targets[:-1]]
