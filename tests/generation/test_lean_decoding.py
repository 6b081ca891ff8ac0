"""The lean decoding paths against their plain counterparts: one query attended with matmuls
equals the fused kernel; an example's beams share one memory row (equal to replicating it);
finished rows and examples leave the batch without changing any output; sources decoded in
batches of similar length come back in their input order, equal to decoding each alone."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from attnkit.data.padding import length_sorted, pad_right
from attnkit.generation import incremental
from attnkit.nn import DecoderCache, KVCache, MultiHeadAttention, padding_mask
from attnkit.nn.attention import _matmuls_win, attention_fused
from attnkit.training.evaluate import translate_ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # bf16 emulated where the CPU lacks it
@torch.no_grad()
def test_one_query_over_many_rows_runs_matmuls_equal_to_the_kernel(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(32, 8, 1, 16, generator=g).to(dtype)  # a decoding step: 32 rows x 8 heads, one query
    k, v = torch.randn(32, 8, 21, 16, generator=g).to(dtype), torch.randn(32, 8, 21, 16, generator=g).to(dtype)
    mask = torch.rand(32, 1, 1, 21, generator=g) > 0.3
    mask[:, ..., 0] = True
    assert _matmuls_win(q)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    assert_close(attention_fused(q, k, v, mask).float(), expected, **tol)
    plain = F.scaled_dot_product_attention(q.float(), k.float(), v.float())  # one query, the last: sees every key
    assert_close(attention_fused(q, k, v, is_causal=True).float(), plain, **tol)


@torch.no_grad()
def test_rows_sharing_a_memory_row_equal_the_memory_replicated() -> None:
    torch.manual_seed(0)
    attention = MultiHeadAttention(24, 4).eval()
    x, memory = torch.randn(6, 3, 24), torch.randn(2, 5, 24)  # 2 examples x 3 beams, 3 query positions
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])[:, None, None, :]  # (2, 1, 1, 5)
    out, weights = attention(x, memory, mask=mask, return_weights=True)
    replicated = memory.repeat_interleave(3, dim=0)
    out_r, weights_r = attention(x, replicated, mask=mask.repeat_interleave(3, dim=0), return_weights=True)
    assert_close(out, out_r)
    assert weights.shape == (6, 4, 3, 5)
    assert_close(weights, weights_r)
    assert_close(attention(x, memory, mask=mask)[0], out_r, atol=1e-5, rtol=1e-5)  # the fused path
    with pytest.raises(ValueError, match="x has 6 rows and memory 4: each memory row serves a whole number"):
        attention(x, torch.randn(4, 5, 24))


def test_cache_reorder_permutes_and_drops_rows() -> None:
    cache = KVCache(capacity=8)
    k, v = torch.randn(4, 2, 3, 5), torch.randn(4, 2, 3, 5)
    cache.update(k, v)
    first, second = torch.tensor([1, 0, 3, 2]), torch.tensor([2, 2, 0, 1])
    cache.reorder(first)
    cache.reorder(second)
    assert_close(cache.k, k[first][second], atol=0, rtol=0)
    assert_close(cache.v, v[first][second], atol=0, rtol=0)
    cache.reorder(torch.tensor([3, 0]))  # two rows dropped
    assert_close(cache.k, k[first][second][[3, 0]], atol=0, rtol=0)
    new_k, new_v = torch.randn(2, 2, 1, 5), torch.randn(2, 2, 1, 5)
    all_k, _ = cache.update(new_k, new_v)
    assert_close(all_k, torch.cat([k[first][second][[3, 0]], new_k], dim=2), atol=0, rtol=0)


def _frequent_tokens(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, **options: object) -> list[int]:
    """The tokens the free-running decoder emits, most frequent first: as the end token, one
    of them makes rows finish at different steps."""
    free = model.generate(ids, mask, eos_token_id=None, **options)[:, -options["max_new_tokens"] :]
    tokens, counts = free.flatten().unique(return_counts=True)
    return tokens[counts.argsort(descending=True, stable=True)].tolist()


def _spy_rows(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of rows kept by each reorder of an IncrementalModel."""
    kept: list[int] = []
    original = incremental.IncrementalModel.reorder

    def spy(self: incremental.IncrementalModel, index: torch.Tensor) -> None:
        kept.append(index.shape[0])
        original(self, index)

    monkeypatch.setattr(incremental.IncrementalModel, "reorder", spy)
    return kept


@pytest.mark.parametrize("num_beams", [1, 3])
@pytest.mark.parametrize("name", ["gpt-tiny", "transformer-tiny", "t5-tiny"])
def test_dropping_finished_rows_equals_decoding_each_alone(
    name: str, num_beams: int, monkeypatch: pytest.MonkeyPatch, wide_model: Callable[..., torch.nn.Module]
) -> None:
    model = wide_model(name)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, 1000, (6, 7), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = mask[4, :2] = 0  # left padding (decoder-only) or a shorter source (encoder-decoder)
    if model.config.is_encoder_decoder:
        mask = mask.flip(1)
        ids = ids.masked_fill(mask == 0, model.config.pad_token_id)
    options = dict(num_beams=num_beams, max_new_tokens=10, length_penalty_style="power")
    kept = _spy_rows(monkeypatch)
    for eos in _frequent_tokens(model, ids, mask, **options)[:8]:
        kept.clear()
        batch = model.generate(ids, mask, eos_token_id=eos, **options)
        if any(n < ids.shape[0] * num_beams for n in kept):
            break
    else:
        pytest.fail("no end token among the 8 most frequent made a row leave the batch: the test tests nothing")
    for row in range(ids.shape[0]):
        real = mask[row].bool()
        alone = model.generate(ids[row : row + 1, real], eos_token_id=eos, **options)[0]
        got = batch[row] if model.config.is_encoder_decoder else batch[row, ids.shape[1] :]
        start = 0 if model.config.is_encoder_decoder else int(real.sum())
        assert got[: alone.shape[0] - start].tolist() == alone[start:].tolist(), f"row {row}"
        assert (got[alone.shape[0] - start :] == model.config.pad_token_id).all()


def test_length_sorted_batches_cover_every_index_once_longest_first() -> None:
    lengths = [3, 9, 1, 9, 4, 7, 2]
    batches = length_sorted(lengths, 3)
    assert batches == [[1, 3, 5], [4, 0, 6], [2]]  # equal lengths keep their order
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        length_sorted(lengths, 0)
    ids, mask = pad_right([[5, 6], [7], [8, 9, 10]], pad=0)
    assert ids.tolist() == [[5, 6, 0], [7, 0, 0], [8, 9, 10]] and mask.sum(1).tolist() == [2, 1, 3]


@pytest.mark.parametrize("num_beams", [1, 4])
def test_length_sorted_translation_keeps_the_input_order(
    num_beams: int, wide_model: Callable[..., torch.nn.Module]
) -> None:
    model = wide_model("transformer-tiny")
    g = torch.Generator().manual_seed(3)
    sources = [torch.randint(4, 1000, (int(n),), generator=g).tolist() for n in (3, 8, 1, 6, 8, 2, 5)]
    got = translate_ids(model, sources, batch_size=3, num_beams=num_beams)
    alone = [translate_ids(model, [s], batch_size=1, num_beams=num_beams)[0] for s in sources]
    assert got == alone


@torch.no_grad()
def test_a_decoding_step_over_the_whole_buffer_equals_the_filled_part() -> None:
    torch.manual_seed(0)
    attention = MultiHeadAttention(32, 4).eval()
    x = torch.randn(20, 6, 32)  # 20 rows x 4 heads: the matmul path
    cache = KVCache(capacity=4)  # grows 4 -> 8 while 6 positions are fed
    for t in range(5):
        attention(x[:, t : t + 1], cache=cache, is_causal=True)
    cache.reorder(torch.arange(19, -1, -1))  # a reorder moves rows into the second buffer
    for buffer in (cache._k, cache._v):  # unfilled positions are read (masked): zeros, never garbage or NaN
        assert buffer.shape[2] == 8 and (buffer[:, :, 5:] == 0).all()
    mask = torch.rand(20, 1, 1, 6, generator=torch.Generator().manual_seed(1)) > 0.2
    mask[..., -1] = True
    step, _ = attention(x.flip(0)[:, 5:6], mask=mask, cache=cache, is_causal=True)
    full, _ = attention(x.flip(0), mask=mask.expand(20, 1, 6, 6), is_causal=True)
    assert_close(step, full[:, 5:6], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("padded", [False, True])
@torch.no_grad()
def test_beam_cache_reranks_by_its_history_as_copying_the_cache_would(padded: bool) -> None:
    """BeamKVCache (slots side by side, an ancestry mask) against KVCache reordered by copying,
    through prompt, steps, re-rankings and a dropped example, with key padding and a bias."""
    torch.manual_seed(0)
    B, k, H, d, P = 3, 4, 4, 8, 3
    attention = MultiHeadAttention(H * d, H).eval()
    beams, plain = DecoderCache(1, False, capacity=2, groups=k), DecoderCache(1, False, capacity=2)
    prompt = torch.randn(B, P, H * d).repeat_interleave(k, dim=0)  # an example's beams share its prompt
    real = torch.ones(B * k, P + 6, dtype=torch.bool)
    if padded:
        real[:k, :1] = False  # example 0's prompt is left-padded
    g = torch.Generator().manual_seed(5)
    rows = B * k
    for t in range(6):
        x = prompt if t == 0 else torch.randn(rows, 1, H * d, generator=g)
        seen = P + t
        mask = padding_mask(real[:rows, :seen])
        bias = torch.randn(1, H, x.shape[1], seen, generator=g)
        got = attention(x, mask=mask, position_bias=bias, cache=beams.self_attn[0], is_causal=True)[0]
        want = attention(x, mask=mask, position_bias=bias, cache=plain.self_attn[0], is_causal=True)[0]
        assert_close(got, want, atol=1e-5, rtol=1e-5, msg=f"step {t}")
        examples = torch.arange(rows // k)
        dropped = None
        if t == 3:  # example 1 is done: its beams leave
            examples = dropped = examples[examples != 1]
            real = torch.cat([real[:k], real[2 * k :]])
        parents = torch.randint(0, k, (examples.shape[0], k), generator=g)
        index = (parents + examples[:, None] * k).view(-1)
        beams.reorder(index, dropped)
        plain.reorder(index, dropped)
        rows = index.shape[0]
    assert beams.self_attn[0]._k.shape[0] == 2  # one buffer row per remaining example, not per beam
