"""``no_repeat_ngram_size``: the bans equal a loop over every n-gram, no decoding mode ever
emits an n-gram twice, and greedy and beam search equal transformers' with the same size."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_beam import HF_PAD, NO_PROCESSORS, hf_model

import attnkit
from attnkit.generation.ngrams import repeated_ngram_bans


def oracle_bans(row: list[int], n: int, vocab_size: int) -> set[int]:
    """The tokens t for which row + [t] ends with an n-gram that occurs earlier in row + [t]."""
    banned = set()
    for t in range(vocab_size):
        seq = [*row, t]
        if len(seq) < n:
            continue
        last = tuple(seq[-n:])
        if any(tuple(seq[i : i + n]) == last for i in range(len(seq) - n)):
            banned.add(t)
    return banned


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_bans_equal_a_loop_over_every_ngram(n: int) -> None:
    g = torch.Generator().manual_seed(n)
    for length in (0, 1, n - 1, n, 12):
        rows = torch.randint(0, 4, (6, length), generator=g)  # 4 symbols: plenty of repeats
        bans = repeated_ngram_bans(rows, n, vocab_size=5)
        assert bans.shape == (6, 5)
        for r, row in enumerate(rows.tolist()):
            assert set(bans[r].nonzero().flatten().tolist()) == oracle_bans(row, n, 5), (row, n)


def ngram_repeats(row: list[int], n: int) -> list[tuple[int, ...]]:
    grams = [tuple(row[i : i + n]) for i in range(len(row) - n + 1)]
    return [g for g in set(grams) if grams.count(g) > 1]


@pytest.fixture
def looping_model(wide_model: Callable[..., torch.nn.Module]) -> Callable[[str], torch.nn.Module]:
    """Random models with a 20-token vocabulary: without the constraint their greedy output
    repeats itself."""
    return lambda name: wide_model(name, vocab_size=20)


@pytest.mark.parametrize("name", ["transformer-tiny", "gpt-tiny"])
@pytest.mark.parametrize("n", [2, 3])
def test_no_decoding_mode_repeats_an_ngram(name: str, n: int, looping_model: Callable[[str], torch.nn.Module]) -> None:
    model = looping_model(name)
    ids = torch.randint(3, 20, (3, 5), generator=torch.Generator().manual_seed(1))
    eos, prompt = model.config.eos_token_id, 1 if model.config.is_encoder_decoder else ids.shape[1]

    def outputs(out: torch.Tensor) -> list[list[int]]:
        """Each row up to its EOS: the padding after it is no output (the prompt or start token is)."""
        rows = []
        for row in out.tolist():
            new = row[prompt:]
            rows.append(row[:prompt] + (new[: new.index(eos) + 1] if eos in new else new))
        return rows

    free = outputs(model.generate(ids, max_new_tokens=24))
    assert any(ngram_repeats(row, n) for row in free), "the unconstrained output must repeat itself"
    modes = [dict(num_beams=1), dict(num_beams=3, length_penalty=0.6), dict(do_sample=True, seed=0)]
    for options in modes:
        for row in outputs(model.generate(ids, max_new_tokens=24, no_repeat_ngram_size=n, **options)):
            assert ngram_repeats(row, n) == [], (options, row)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "3"])
def test_bad_sizes_are_refused(bad: object, looping_model: Callable[[str], torch.nn.Module]) -> None:
    model = looping_model("transformer-tiny")
    with pytest.raises(ValueError, match="no_repeat_ngram_size must be an integer >= 1"):
        model.generate(torch.tensor([[3, 4, 5]]), no_repeat_ngram_size=bad)


@pytest.mark.parametrize("family", ["marian", "gpt2"])
def test_matches_transformers(tmp_path: Path, family: str) -> None:
    torch.manual_seed(0)
    hf = hf_model(family).eval()
    with torch.no_grad():  # wide weights: outputs that loop, so the bans decide tokens
        for name, p in hf.named_parameters():
            if "embed_positions" not in name:
                p.normal_(0.0, 0.4 if p.dim() == 2 else 0.1)
    hf.save_pretrained(tmp_path)
    ours = attnkit.from_pretrained(tmp_path).eval()
    ids = torch.randint(2, 97, (3, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    banned_something = False
    for n, k in itertools.product((1, 2, 3), (1, 3)):
        options = dict(num_beams=k, max_new_tokens=12, eos_token_id=HF_PAD - 1, pad_token_id=HF_PAD)
        hf_options = {**NO_PROCESSORS, "no_repeat_ngram_size": n, "length_penalty": 0.0, "do_sample": False}
        expected = hf.generate(ids, attention_mask=mask, **options, **hf_options)
        options["length_penalty"] = 0.0  # as hf_options: given explicitly, it overrides the checkpoint's default
        got = ours.generate(ids, mask, no_repeat_ngram_size=n, **options)
        assert got.tolist() == expected.tolist(), (n, k)
        banned_something |= got.tolist() != ours.generate(ids, mask, **options).tolist()
    assert banned_something, "the constraint never changed an output: the comparison would not exercise it"
