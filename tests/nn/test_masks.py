"""Tests for attnkit.nn.masks: the causal mask of [eq:att-mask] and the padding masks."""

from __future__ import annotations

import re

import pytest
import torch
from torch.testing import assert_close

from attnkit.nn.attention import attention_fused, attention_math
from attnkit.nn.masks import causal_mask, lengths_to_mask, padding_mask


def _chapter_additive_mask(n: int, m: int) -> torch.Tensor:
    """[eq:att-mask] written out entry by entry, with the n queries as the last n of m positions.

    M_ij = 0 if j <= i (here: j <= i + m - n), -inf otherwise.
    """
    offset = m - n
    rows = [[0.0 if j <= i + offset else float("-inf") for j in range(m)] for i in range(n)]
    return torch.tensor(rows, dtype=torch.float32).reshape(n, m)


# --------------------------------------------------------------------------- causal_mask


@pytest.mark.parametrize("n", [0, 1, 2, 5, 8])
def test_causal_mask_square_matches_chapter(n: int) -> None:
    mask = causal_mask(n)
    assert mask.dtype == torch.bool
    assert mask.shape == (n, n)
    expected = torch.tensor([[j <= i for j in range(n)] for i in range(n)], dtype=torch.bool).reshape(n, n)
    assert torch.equal(mask, expected)
    assert torch.equal(causal_mask(n, n), expected)
    # True exactly where [eq:att-mask] has 0, False where it has -inf
    additive = torch.zeros(n, n).masked_fill(~mask, float("-inf"))
    assert_close(additive, _chapter_additive_mask(n, n), rtol=0.0, atol=0.0)


@pytest.mark.parametrize("n,m", [(1, 1), (1, 4), (2, 5), (3, 3), (3, 8), (0, 3)])
def test_causal_mask_cached_decoding(n: int, m: int) -> None:
    """n new queries after m - n cached positions: query i sits at absolute position i+m-n."""
    mask = causal_mask(n, m)
    assert mask.dtype == torch.bool
    assert mask.shape == (n, m)
    expected = torch.tensor([[j <= i + m - n for j in range(m)] for i in range(n)], dtype=torch.bool).reshape(n, m)
    assert torch.equal(mask, expected)
    # the same rows as the last n rows of the full (m, m) mask
    assert torch.equal(mask, causal_mask(m)[m - n :])
    additive = torch.zeros(n, m).masked_fill(~mask, float("-inf"))
    assert_close(additive, _chapter_additive_mask(n, m), rtol=0.0, atol=0.0)


def test_causal_mask_single_step_decoding_sees_everything() -> None:
    assert torch.equal(causal_mask(1, 6), torch.ones(1, 6, dtype=torch.bool))


@pytest.mark.parametrize("n,m", [(3, 2), (5, 0), (2, 1)])
def test_causal_mask_rejects_m_less_than_n(n: int, m: int) -> None:
    with pytest.raises(ValueError, match=rf"n={n}, m={m}"):
        causal_mask(n, m)


def test_causal_mask_rejects_negative_n() -> None:
    with pytest.raises(ValueError, match=r"n=-1"):
        causal_mask(-1, 2)


def test_causal_mask_device_argument() -> None:
    assert causal_mask(3, device="cpu").device.type == "cpu"


# --------------------------------------------------------------------------- lengths_to_mask


def test_lengths_to_mask() -> None:
    lengths = torch.tensor([3, 0, 5, 1])
    expected = torch.tensor(
        [
            [True, True, True, False, False],
            [False, False, False, False, False],
            [True, True, True, True, True],
            [True, False, False, False, False],
        ]
    )
    mask = lengths_to_mask(lengths)
    assert mask.dtype == torch.bool
    assert torch.equal(mask, expected)
    padded = lengths_to_mask(lengths, max_len=7)
    assert padded.shape == (4, 7)
    assert torch.equal(padded[:, :5], expected)
    assert not bool(padded[:, 5:].any())
    assert torch.equal(padded.sum(-1), lengths)


def test_lengths_to_mask_int32_and_empty() -> None:
    assert torch.equal(
        lengths_to_mask(torch.tensor([2, 1], dtype=torch.int32)),
        torch.tensor([[True, True], [True, False]]),
    )
    assert lengths_to_mask(torch.tensor([], dtype=torch.long)).shape == (0, 0)


@pytest.mark.parametrize(
    "lengths,max_len,pattern",
    [
        (torch.tensor([[1, 2]]), None, re.escape("(1, 2)")),
        (torch.tensor([1.0, 2.0]), None, r"torch\.float32"),
        (torch.tensor([2, -1]), None, r"-1"),
        (torch.tensor([2, 6]), 4, r"max_len=4.*\b6\b"),
    ],
    ids=["2d", "float", "negative", "max-len-too-short"],
)
def test_lengths_to_mask_errors(lengths: torch.Tensor, max_len: int | None, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        lengths_to_mask(lengths, max_len)


# --------------------------------------------------------------------------- padding_mask


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_padding_mask_shape_and_values(dtype: torch.dtype) -> None:
    attention_mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]).to(dtype)
    mask = padding_mask(attention_mask)
    assert mask.dtype == torch.bool
    assert mask.shape == (3, 1, 1, 5)
    assert torch.equal(mask[:, 0, 0], attention_mask.bool())
    assert torch.equal(mask, lengths_to_mask(torch.tensor([3, 5, 1]))[:, None, None, :])


def test_padding_mask_ignores_padded_keys_in_attention() -> None:
    """With (B,1,1,T) broadcast over (B,H,n,T), each element attends only its real keys."""
    g = torch.Generator().manual_seed(0)
    B, H, n, T, d = 3, 2, 4, 6, 5
    lengths = torch.tensor([6, 2, 4])
    q = torch.randn(B, H, n, d, generator=g)
    k = torch.randn(B, H, T, d, generator=g)
    v = torch.randn(B, H, T, d, generator=g)
    mask = padding_mask(lengths_to_mask(lengths).long())
    out_math, _ = attention_math(q, k, v, mask)
    out_fused = attention_fused(q, k, v, mask)
    for b, length in enumerate(lengths.tolist()):
        ref, _ = attention_math(q[b], k[b, :, :length], v[b, :, :length])
        assert_close(out_math[b], ref)
        assert_close(out_fused[b], ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_padding_mask_rejects_float(dtype: torch.dtype) -> None:
    with pytest.raises(ValueError, match=re.escape(str(dtype))):
        padding_mask(torch.ones(2, 3, dtype=dtype))


@pytest.mark.parametrize("bad", [2, -1, 7])
def test_padding_mask_rejects_values_other_than_0_1(bad: int) -> None:
    attention_mask = torch.tensor([[1, 1, 0], [1, bad, 0]])
    with pytest.raises(ValueError, match=rf"(?<![\d-]){re.escape(str(bad))}\b"):
        padding_mask(attention_mask)


@pytest.mark.parametrize("shape", [(5,), (2, 3, 4), (1, 1, 1, 4)])
def test_padding_mask_rejects_wrong_ndim(shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=re.escape(str(shape))):
        padding_mask(torch.ones(shape, dtype=torch.long))
