"""BERT's masking: how many positions are chosen, what they become, and what is never touched."""

from __future__ import annotations

import math

import pytest
import torch

from attnkit.data.specials import Specials
from attnkit.objectives import IGNORE_INDEX, MaskedLM
from attnkit.objectives.base import pad_batch


def corpus(ordinary: list[int], unk: int, n: int, seed: int) -> list[list[int]]:
    """``n`` random examples of 20..60 tokens, with the odd ``unk`` (a special that may occur in text)."""
    g = torch.Generator().manual_seed(seed)
    pool = torch.tensor([*ordinary, unk])
    lengths = torch.randint(20, 61, (n,), generator=g).tolist()
    return [pool[torch.randint(len(pool), (length,), generator=g)].tolist() for length in lengths]


def test_mlm_proportions(specials: Specials, ordinary: list[int]) -> None:
    examples = corpus(ordinary, specials.unk, n=2000, seed=0)
    batch = MaskedLM(specials).batch(examples, torch.Generator().manual_seed(0))
    original, _ = pad_batch([[specials.bos, *x, specials.eos] for x in examples], specials.pad)
    inputs, chosen = batch["input_ids"], batch["labels"] != IGNORE_INDEX

    # Exactly max(1, round(0.15 n)) of each row's n ordinary positions ...
    n = [sum(t in ordinary for t in x) for x in examples]
    assert chosen.sum(dim=1).tolist() == [max(1, round(0.15 * k)) for k in n]
    # ... so the overall fraction misses 15% only by rounding, at most half a token a row.
    assert abs(chosen.sum().item() / sum(n) - 0.15) <= 0.5 * len(examples) / sum(n)

    # 80% mask, 10% random, 10% kept, each a binomial count; a random draw can hit the original
    # token (1 in |ordinary|), which then looks kept. Tolerance: 5 binomial standard deviations.
    total, hit = chosen.sum().item(), 1 / len(ordinary)
    masked = (chosen & (inputs == specials.mask)).sum().item()
    replaced = (chosen & (inputs != specials.mask) & (inputs != original)).sum().item()
    kept = (chosen & (inputs == original)).sum().item()
    for count, p in ((masked, 0.8), (replaced, 0.1 * (1 - hit)), (kept, 0.1 + 0.1 * hit)):
        assert abs(count - total * p) <= 5 * math.sqrt(total * p * (1 - p)), (count, total * p)


def test_specials_are_never_chosen_nor_drawn(specials: Specials, ordinary: list[int]) -> None:
    examples = corpus(ordinary, specials.unk, n=500, seed=1)
    batch = MaskedLM(specials).batch(examples, torch.Generator().manual_seed(1))
    original, _ = pad_batch([[specials.bos, *x, specials.eos] for x in examples], specials.pad)
    inputs, labels = batch["input_ids"], batch["labels"]
    chosen = labels != IGNORE_INDEX
    is_special = torch.isin(original, torch.tensor(sorted(specials.all)))
    assert not (chosen & is_special).any()  # bos, eos, pad and unk are never chosen
    assert (labels[chosen] == original[chosen]).all()  # labels are the original tokens
    assert (inputs[~chosen] == original[~chosen]).all()  # the rest is untouched
    drawn = inputs[chosen & (inputs != specials.mask) & (inputs != original)]
    assert set(drawn.tolist()) == set(ordinary)  # random tokens: every ordinary id, never a special


def test_token_type_ids_are_zeros_and_padding_is_masked(specials: Specials) -> None:
    batch = MaskedLM(specials).batch([[40] * 10, [41] * 3], torch.Generator().manual_seed(0))
    assert (batch["token_type_ids"] == 0).all()
    assert batch["attention_mask"].tolist() == [[1] * 12, [1] * 5 + [0] * 7]
    assert (batch["labels"][1, 5:] == IGNORE_INDEX).all()


def test_batches_are_reproducible_from_the_generator(specials: Specials, ordinary: list[int]) -> None:
    examples = corpus(ordinary, specials.unk, n=20, seed=2)
    first, again, other = (MaskedLM(specials).batch(examples, torch.Generator().manual_seed(s)) for s in (7, 7, 8))
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["labels"], other["labels"])


def test_a_text_of_specials_only_has_no_target(specials: Specials) -> None:
    batch = MaskedLM(specials).batch([[], [specials.unk]], torch.Generator().manual_seed(0))
    assert (batch["labels"] == IGNORE_INDEX).all()


def test_a_vocabulary_of_specials_only_is_refused(specials: Specials) -> None:
    with pytest.raises(ValueError, match="no ordinary token"):
        MaskedLM(specials, vocab_size=len(specials.all))
