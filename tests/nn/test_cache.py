"""Incremental decoding with key/value caches equals the full causal forward.

[alg:att-decode] recomputes the whole prefix at every step; the cache keeps the earlier keys
and values instead. Because the causal mask [eq:att-mask] hides the future, position t's
output cannot change when later positions are appended, so feeding the target one token (or
one chunk) at a time must give the same numbers as one causal pass over the whole sequence.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close

from attnkit.nn import (
    Decoder,
    DecoderCache,
    DecoderLayer,
    KVCache,
    LayerNorm,
    MultiHeadAttention,
    RelativePositionBias,
    RotaryEmbedding,
    causal_mask,
)

D_MODEL, N_HEADS, D_FF = 32, 4, 64
D_K = D_MODEL // N_HEADS
B, T, S = 3, 6, 5
ATOL, RTOL = 1e-5, 1e-5


@torch.no_grad()
def _randomize_norms(module: torch.nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, LayerNorm):
            m.gamma.copy_(1.0 + 0.3 * torch.randn_like(m.gamma))
            m.beta.copy_(0.3 * torch.randn_like(m.beta))


def make_decoder(kind: str) -> Decoder:
    """``"cross"``: post-LN encoder-decoder stack. ``"gpt"``: pre-LN, no cross-attention,
    final norm. ``"t5bias"``: pre-LN with a causal T5 relative bias. ``"rotary"``: GPT-like
    with rotary self-attention put into each layer."""
    torch.manual_seed(0)
    cross = kind == "cross"
    norm_first = kind != "cross"
    layers = [
        DecoderLayer(
            D_MODEL, N_HEADS, D_FF, dropout=0.0, cross_attention=cross or kind == "t5bias", norm_first=norm_first
        )
        for _ in range(2)
    ]
    if kind == "rotary":
        for layer in layers:  # DecoderLayer has no rotary knob: swap in a rotary MHA
            layer.self_attn = MultiHeadAttention(D_MODEL, N_HEADS, rotary=RotaryEmbedding(D_K))
    bias = RelativePositionBias(N_HEADS, bidirectional=False) if kind == "t5bias" else None
    decoder = Decoder(layers, final_norm=None if cross else LayerNorm(D_MODEL), position_bias=bias)
    _randomize_norms(decoder)
    return decoder.eval()


def inputs(decoder: Decoder) -> tuple[Tensor, Tensor | None, Tensor | None]:
    torch.manual_seed(1)
    x = torch.randn(B, T, D_MODEL)
    if not decoder.cross_attention:
        return x, None, None
    memory = torch.randn(B, S, D_MODEL)
    memory_mask = (torch.arange(S)[None, :] < torch.tensor([5, 2, 4])[:, None])[:, None, None, :]
    return x, memory, memory_mask


def run_in_chunks(
    decoder: Decoder,
    x: Tensor,
    memory: Tensor | None,
    memory_mask: Tensor | None,
    chunks: list[int],
) -> tuple[Tensor, DecoderCache]:
    """Feed ``x`` in pieces of the given lengths through one cache; concatenate the outputs."""
    assert sum(chunks) == x.shape[1]
    cache = decoder.new_cache()
    outs, start = [], 0
    for size in chunks:
        outs.append(decoder(x[:, start : start + size], memory, memory_mask=memory_mask, cache=cache))
        start += size
        assert len(cache) == start
    return torch.cat(outs, dim=1), cache


@pytest.mark.parametrize("chunks", [[1] * T, [3, 1, 2], [T]], ids=["tokens", "3-1-2", "whole"])
@pytest.mark.parametrize("kind", ["cross", "gpt", "t5bias", "rotary"])
@torch.no_grad()
def test_kv_cache_matches_full_forward(kind: str, chunks: list[int]) -> None:
    decoder = make_decoder(kind)
    assert decoder.cross_attention == (kind in ("cross", "t5bias"))
    x, memory, memory_mask = inputs(decoder)
    full = decoder(x, memory, memory_mask=memory_mask)
    got, cache = run_in_chunks(decoder, x, memory, memory_mask, chunks)
    assert_close(got, full, atol=ATOL, rtol=RTOL)
    for layer_cache in cache.self_attn:
        assert layer_cache.k is not None and layer_cache.k.shape == (B, N_HEADS, T, D_K)


@torch.no_grad()
def test_kv_cache_is_not_trivially_equal() -> None:
    """The check above has teeth: without the cache, a lone token sees only itself."""
    decoder = make_decoder("gpt")
    x, _, _ = inputs(decoder)
    full = decoder(x)
    last_alone = decoder(x[:, -1:])
    assert not torch.allclose(last_alone, full[:, -1:], atol=1e-3)


@pytest.mark.parametrize("chunks", [[1] * T, [3, 1, 2]], ids=["tokens", "3-1-2"])
@torch.no_grad()
def test_mha_rotary_cache_matches_full_forward(chunks: list[int]) -> None:
    """MHA-level: rotary self-attention with a KVCache fed incrementally (rotated at offset
    len(cache)) equals the full forward with the causal mask."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(D_MODEL, N_HEADS, rotary=RotaryEmbedding(D_K)).eval()
    x = torch.randn(B, T, D_MODEL)
    full, _ = mha(x, mask=causal_mask(T))
    cache, outs, start = KVCache(), [], 0
    for size in chunks:
        end = start + size
        out, _ = mha(x[:, start:end], mask=causal_mask(size, end), cache=cache)
        outs.append(out)
        start = end
    assert len(cache) == T
    assert_close(torch.cat(outs, dim=1), full, atol=ATOL, rtol=RTOL)
    # and rotary really matters: the same MHA without rotation differs
    mha.rotary = None
    plain, _ = mha(x, mask=causal_mask(T))
    assert not torch.allclose(plain, full, atol=1e-3)


@torch.no_grad()
def test_cross_attention_cache_computes_memory_once() -> None:
    decoder = make_decoder("cross")
    x, memory, memory_mask = inputs(decoder)
    full = decoder(x, memory, memory_mask=memory_mask)

    calls = {"w_k": 0, "w_v": 0}
    hooks = []
    for layer in decoder.layers:
        for name in calls:

            def count(*_: object, name: str = name) -> None:
                calls[name] += 1

            hooks.append(getattr(layer.cross_attn, name).register_forward_hook(count))

    cache = decoder.new_cache()
    outs = [decoder(x[:, :1], memory, memory_mask=memory_mask, cache=cache)]
    static = [(c.k, c.v, c.k.data_ptr(), c.v.data_ptr()) for c in cache.cross_attn]
    for c in cache.cross_attn:
        assert c.static and c.k.shape == (B, N_HEADS, S, D_K)
    for t in range(1, T):
        # memory=None from the second step on: the cached keys/values are enough
        outs.append(decoder(x[:, t : t + 1], None, memory_mask=memory_mask, cache=cache))
        for c, (k, v, k_ptr, v_ptr) in zip(cache.cross_attn, static, strict=True):
            assert c.k is k and c.v is v
            assert c.k.data_ptr() == k_ptr and c.v.data_ptr() == v_ptr
    for h in hooks:
        h.remove()

    assert calls == {"w_k": 2, "w_v": 2}  # once per layer, at the first step only
    assert_close(torch.cat(outs, dim=1), full, atol=ATOL, rtol=RTOL)

    # a later step that passes memory again still reuses the cached projection
    k_before = cache.cross_attn[0].k
    decoder(torch.randn(B, 1, D_MODEL), torch.randn(B, S, D_MODEL), memory_mask=memory_mask, cache=cache)
    assert cache.cross_attn[0].k is k_before


@torch.no_grad()
def test_cross_attention_without_memory_or_cache_raises() -> None:
    decoder = make_decoder("cross")
    x, _, _ = inputs(decoder)
    with pytest.raises(ValueError, match="memory"):
        decoder(x[:, :1], None, cache=decoder.new_cache())


@torch.no_grad()
def test_cache_reorder() -> None:
    decoder = make_decoder("cross")
    x, memory, memory_mask = inputs(decoder)
    _, cache = run_in_chunks(decoder, x[:, :4], memory, memory_mask, [2, 1, 1])
    caches = [*cache.self_attn, *cache.cross_attn]
    before = [(c.k.clone(), c.v.clone()) for c in caches]

    index = torch.tensor([2, 0, 0])  # permute and duplicate (beam search keeping hypotheses)
    cache.reorder(index, examples=index)
    assert len(cache) == 4
    for c, (k, v) in zip(caches, before, strict=True):
        assert_close(c.k, k[index], atol=0, rtol=0)
        assert_close(c.v, v[index], atol=0, rtol=0)

    # decoding continues as if the reordered hypotheses had been decoded from the start
    step = decoder(x[index, 4:5], memory[index], memory_mask=memory_mask[index], cache=cache)
    full = decoder(x[index, :5], memory[index], memory_mask=memory_mask[index])
    assert_close(step, full[:, 4:5], atol=ATOL, rtol=RTOL)


def test_kv_cache_basics() -> None:
    cache = KVCache()
    assert len(cache) == 0
    cache.reorder(torch.tensor([0]))  # an empty cache reorders to nothing, without error
    k1, v1 = torch.randn(2, N_HEADS, 3, D_K), torch.randn(2, N_HEADS, 3, D_K)
    k2, v2 = torch.randn(2, N_HEADS, 1, D_K), torch.randn(2, N_HEADS, 1, D_K)
    cache.update(k1, v1)
    k, v = cache.update(k2, v2)
    assert len(cache) == 4
    assert_close(k, torch.cat([k1, k2], dim=-2), atol=0, rtol=0)
    assert_close(v, torch.cat([v1, v2], dim=-2), atol=0, rtol=0)

    static = KVCache(static=True)
    static.update(k1, v1)
    k, _ = static.update(k2, v2)  # static: replaces, never appends
    assert k is k2 and len(static) == 1

    empty = DecoderCache(0, cross_attention=False)
    assert len(empty) == 0


def test_kv_cache_buffers_grow_and_equal_concatenation() -> None:
    """The preallocated buffers double when full; what they return is the concatenation."""
    torch.manual_seed(0)
    cache = KVCache(capacity=2)
    ks, vs = [], []
    for t in (1, 1, 3, 1, 7):
        k, v = torch.randn(2, 3, t, 4), torch.randn(2, 3, t, 5)
        ks.append(k)
        vs.append(v)
        got_k, got_v = cache.update(k, v)
        assert torch.equal(got_k, torch.cat(ks, dim=2)) and torch.equal(got_v, torch.cat(vs, dim=2))
    assert len(cache) == 13
    cache.reorder(torch.tensor([1, 1]))
    assert torch.equal(cache.k, torch.cat(ks, dim=2)[[1, 1]])
