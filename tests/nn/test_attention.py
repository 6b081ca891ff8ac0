"""Tests for attnkit.nn.attention against the chapter (06-attention.tex).

References: [eq:att-sdpa], [eq:att-alpha] (rows of the weights sum to 1), [prop:att-variance]
(Var(q·k) = d_k), [eq:att-mask]/[eq:att-masked] (the causal mask; masked weights are 0).
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.testing import assert_close

import attnkit.nn.attention as attention_module
from attnkit.nn.attention import (
    MultiHeadAttention,
    attention_fused,
    attention_math,
    scaled_dot_product_attention,
)
from attnkit.nn.masks import causal_mask

FP32_TOL = {"atol": 1e-5, "rtol": 1e-5}
EXACT = {"atol": 0.0, "rtol": 0.0}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _qkv(
    lead: tuple[int, ...], n: int, m: int, d_k: int, d_v: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    q = torch.randn(*lead, n, d_k, generator=g)
    k = torch.randn(*lead, m, d_k, generator=g)
    v = torch.randn(*lead, m, d_v, generator=g)
    return q, k, v


def _padding(lead: tuple[int, ...], m: int, seed: int) -> torch.Tensor:
    """Key-padding mask (B, 1, ..., 1, m): batch element b keeps its first length_b keys."""
    g = _gen(seed)
    batch = lead[0] if lead else 1
    lengths = torch.randint(1, m + 1, (batch,), generator=g)  # >= 1 real key per sequence
    keep = torch.arange(m) < lengths[:, None]  # (B, m)
    if not lead:
        return keep.reshape(m)  # a single sequence: one (m,) row of keys
    return keep.reshape((batch,) + (1,) * (len(lead) - 1) + (1, m))


def _mask(kind: str, lead: tuple[int, ...], n: int, m: int, seed: int) -> torch.Tensor | None:
    if kind == "none":
        return None
    if kind == "random":
        return torch.rand(*lead, n, m, generator=_gen(seed)) > 0.4
    if kind == "causal":
        return causal_mask(n, m) if n <= m else causal_mask(n)[:, :m]
    if kind == "padding":
        return _padding(lead, m, seed)
    raise AssertionError(kind)


# --------------------------------------------------------------------------- [eq:att-alpha]


@pytest.mark.parametrize("kind", ["none", "random", "causal", "padding"])
@pytest.mark.parametrize("lead,n,m", [((2, 3), 4, 6), ((1,), 5, 5), ((), 3, 7)])
def test_rows_sum_to_one(kind: str, lead: tuple[int, ...], n: int, m: int) -> None:
    q, k, v = _qkv(lead, n, m, d_k=8, d_v=5, seed=1)
    mask = _mask(kind, lead, n, m, seed=2)
    if kind == "random":
        mask[..., :, 0] = True  # every row has a key; fully-masked rows are tested below
    if kind == "padding":
        mask[..., 0] = True
    _, weights = attention_math(q, k, v, mask)
    assert weights.shape == (*lead, n, m)
    assert bool((weights >= 0).all())
    assert_close(weights.sum(-1), torch.ones(*lead, n), **FP32_TOL)


def test_rows_sum_to_one_matches_eq_att_alpha() -> None:
    """The weights are literally [eq:att-alpha]: exp(q_i·k_j/√d_k) / Σ_j' exp(q_i·k_j'/√d_k)."""
    q, k, v = _qkv((2,), 4, 6, d_k=8, d_v=3, seed=3)
    logits = torch.einsum("bid,bjd->bij", q.double(), k.double()) / math.sqrt(8)
    alpha = logits.exp() / logits.exp().sum(-1, keepdim=True)
    out, weights = attention_math(q, k, v)
    assert_close(weights.double(), alpha, **FP32_TOL)
    assert_close(out.double(), alpha @ v.double(), **FP32_TOL)


@pytest.mark.parametrize("kind", ["random", "causal", "padding"])
def test_masked_weights_are_exactly_zero(kind: str) -> None:
    lead, n, m = (2, 3), 5, 7
    q, k, v = _qkv(lead, n, m, d_k=4, d_v=4, seed=4)
    # large logits: the unmasked scores alone would never underflow to 0 by themselves
    q = q * 10
    mask = _mask(kind, lead, n, m, seed=5)
    _, weights = attention_math(q, k, v, mask)
    full = mask.expand(*lead, n, m)
    masked = weights[~full]
    assert masked.numel() > 0
    assert bool((masked == 0.0).all()), masked[masked != 0.0]
    if kind == "causal":
        above = ~torch.ones(n, m, dtype=torch.bool).tril(diagonal=m - n)
        assert bool((weights[..., above] == 0.0).all())


def test_default_scale_is_inverse_sqrt_dk() -> None:
    q, k, v = _qkv((2, 2), 3, 4, d_k=9, d_v=2, seed=6)
    assert_close(attention_math(q, k, v)[0], attention_math(q, k, v, scale=1.0 / 3.0)[0], **EXACT)
    assert_close(attention_fused(q, k, v), attention_fused(q, k, v, scale=1.0 / 3.0), **FP32_TOL)


# --------------------------------------------------------------------------- [prop:att-variance]


@pytest.mark.parametrize("d_k", [16, 64, 256])
def test_variance_property(d_k: int) -> None:
    """[prop:att-variance]: Var(q·k) = d_k and Var(q·k/√d_k) = 1 for iid unit-variance q, k.

    Tolerance. With s = q·k for standard Gaussian q, k: Var(s) = d_k and
    E[s^4] = 3 d_k^2 + 6 d_k, so the sample variance of N draws has relative standard error
    sqrt((E[s^4]/Var(s)^2 - 1)/N) = sqrt((2 + 6/d_k)/N): about 0.0034 (d_k=16) to 0.0032
    (d_k=256) for N = 200_000. We allow 5 standard errors (~1.7%), so a correct
    implementation fails with probability ~1e-6 and is in any case deterministic under the
    fixed seed. The mean's standard error is sqrt(d_k/N); we allow 5 of those too.
    """
    n_samples, chunk = 200_000, 20_000
    g = _gen(200_000 + d_k)
    parts = []
    for _ in range(n_samples // chunk):
        q = torch.randn(chunk, d_k, generator=g)
        k = torch.randn(chunk, d_k, generator=g)
        parts.append(torch.einsum("nd,nd->n", q, k).double())
    s = torch.cat(parts)
    scaled = s / math.sqrt(d_k)

    rel_se = math.sqrt((3 * d_k**2 + 6 * d_k) / d_k**2 - 1) / math.sqrt(n_samples)
    tol = 5 * rel_se
    assert_close(s.var(), torch.tensor(float(d_k), dtype=torch.float64), rtol=tol, atol=0.0)
    assert_close(scaled.var(), torch.tensor(1.0, dtype=torch.float64), rtol=tol, atol=0.0)
    mean_tol = 5 * math.sqrt(d_k / n_samples)
    assert_close(s.mean(), torch.tensor(0.0, dtype=torch.float64), rtol=0.0, atol=mean_tol)


# --------------------------------------------------------------------------- fused == math

SHAPES = [
    # (lead dims, n, m, d_k, d_v)
    ((2, 3), 4, 7, 8, 5),
    ((1, 1), 1, 1, 1, 1),
    ((3, 2), 6, 6, 16, 3),
    ((2, 4), 9, 2, 5, 12),
    ((2,), 3, 5, 6, 7),
    ((), 5, 3, 4, 9),
    ((2, 2, 3), 2, 4, 3, 2),
]


@pytest.mark.parametrize("scale", [None, 1.0])
@pytest.mark.parametrize("kind", ["none", "random", "causal", "padding", "bias", "padding+bias"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[0])) + f"-{s[1:]}")
def test_fused_equals_math(shape: tuple, kind: str, scale: float | None) -> None:
    lead, n, m, d_k, d_v = shape
    q, k, v = _qkv(lead, n, m, d_k, d_v, seed=7)
    mask_kind = kind.split("+")[0] if kind != "bias" else "none"
    mask = _mask(mask_kind, lead, n, m, seed=8)
    bias = None
    if "bias" in kind:
        # broadcast over the batch dimension as T5's relative-position bias does
        bias_lead = (1, *lead[1:]) if lead else ()
        bias = torch.randn(*bias_lead, n, m, generator=_gen(9))
    out_math, weights = attention_math(q, k, v, mask, scale=scale, bias=bias)
    out_fused = attention_fused(q, k, v, mask, scale=scale, bias=bias)
    assert out_math.shape == out_fused.shape == (*lead, n, d_v)
    assert weights.shape == (*lead, n, m)
    assert_close(out_fused, out_math, **FP32_TOL)


def test_front_dispatches(monkeypatch: pytest.MonkeyPatch) -> None:
    lead, n, m = (2, 3), 4, 6
    q, k, v = _qkv(lead, n, m, d_k=8, d_v=5, seed=10)
    mask = _mask("random", lead, n, m, seed=11)
    bias = torch.randn(1, 3, n, m, generator=_gen(12))

    result = scaled_dot_product_attention(q, k, v, mask, return_weights=True, bias=bias)
    assert isinstance(result, tuple) and len(result) == 2
    out_ref, w_ref = attention_math(q, k, v, mask, bias=bias)
    assert_close(result[0], out_ref, **EXACT)
    assert_close(result[1], w_ref, **EXACT)

    plain = scaled_dot_product_attention(q, k, v, mask, bias=bias)
    assert isinstance(plain, torch.Tensor)
    assert_close(plain, attention_fused(q, k, v, mask, bias=bias), **EXACT)

    # and the front really goes through the named path (values alone cannot tell)
    calls: list[str] = []
    real_math, real_fused = attention_module.attention_math, attention_module.attention_fused

    def spy_math(*a, **kw):
        calls.append("math")
        return real_math(*a, **kw)

    def spy_fused(*a, **kw):
        calls.append("fused")
        return real_fused(*a, **kw)

    monkeypatch.setattr(attention_module, "attention_math", spy_math)
    monkeypatch.setattr(attention_module, "attention_fused", spy_fused)
    attention_module.scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    attention_module.scaled_dot_product_attention(q, k, v, mask)
    assert calls == ["math", "fused"]


def _fp64_problem() -> tuple[torch.Tensor, ...]:
    g = _gen(30)
    q = torch.randn(2, 3, 3, dtype=torch.float64, generator=g)
    k = torch.randn(2, 4, 3, dtype=torch.float64, generator=g)
    v = torch.randn(2, 4, 2, dtype=torch.float64, generator=g)
    mask = torch.rand(2, 3, 4, generator=g) > 0.3
    mask[..., 0] = True
    mask[0, 1] = False  # one fully-masked row
    return q, k, v, mask


def _fp64_reference(q, k, v, mask) -> torch.Tensor:
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~mask, -math.inf)
    alive = mask.any(-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(~alive, 0.0), dim=-1) * alive
    return weights @ v


def test_fused_float64_is_exact() -> None:
    q, k, v, mask = _fp64_problem()
    ref = _fp64_reference(q, k, v, mask)
    assert_close(attention_fused(q, k, v, mask), ref, atol=1e-12, rtol=1e-12)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b, c: attention_fused(a, b, c, mask), (q, k, v), fast_mode=True)


def test_math_float64_is_exact() -> None:
    q, k, v, mask = _fp64_problem()
    out, _ = attention_math(q, k, v, mask)
    assert_close(out, _fp64_reference(q, k, v, mask), atol=1e-12, rtol=1e-12)


def test_math_gradcheck_float64() -> None:
    q, k, v, mask = _fp64_problem()
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    torch.autograd.gradcheck(lambda a, b, c: attention_math(a, b, c, mask)[0], (q, k, v))


# --------------------------------------------------------------------------- fully-masked rows


def _math_out(q, k, v, mask):
    return attention_math(q, k, v, mask)[0]


def _fused_out(q, k, v, mask):
    return attention_fused(q, k, v, mask)


@pytest.mark.parametrize("path", [_math_out, _fused_out], ids=["math", "fused"])
@pytest.mark.parametrize("precision", ["fp32", "autocast-bf16", "bf16-inputs"])
def test_fully_masked_row_is_zero_with_finite_grads(path, precision: str) -> None:
    B, H, n, m, d = 2, 2, 4, 5, 8
    g = _gen(13)
    x_q = torch.randn(B, H, n, d, generator=g, requires_grad=True)
    x_kv = torch.randn(B, H, m, d, generator=g, requires_grad=True)
    mask = torch.rand(B, H, n, m, generator=g) > 0.3
    mask[..., 0] = True
    mask[0, 1, 2, :] = False  # query row (b=0, h=1, i=2) has no key to attend
    mask[1, :, 0, :] = False  # query row 0 of batch 1, every head

    if precision == "autocast-bf16":
        torch.manual_seed(0)
        proj_q, proj_k, proj_v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, 6)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            q, k, v = proj_q(x_q), proj_k(x_kv), proj_v(x_kv)
            assert q.dtype == k.dtype == v.dtype == torch.bfloat16
            out = path(q, k, v, mask)
    else:
        dtype = torch.float32 if precision == "fp32" else torch.bfloat16
        q, k, v = x_q.to(dtype), x_kv.to(dtype), (x_kv[..., :6] * 2).to(dtype)
        out = path(q, k, v, mask)
    for t in (q, k, v):
        t.retain_grad()

    dead = ~mask.any(-1)  # (B, H, n)
    assert int(dead.sum()) == 1 + H
    assert bool(out.isfinite().all())
    assert bool((out[dead] == 0.0).all()), out[dead]
    assert bool(out[~dead].abs().sum(-1).gt(0).all())

    upstream = torch.randn(out.shape, generator=_gen(14)).to(out.dtype)
    (out * upstream).float().sum().backward()
    for name, t in (("q", q), ("k", k), ("v", v), ("x_q", x_q), ("x_kv", x_kv)):
        assert t.grad is not None, name
        assert bool(t.grad.isfinite().all()), name
    # the dead rows receive no gradient at all
    assert bool((q.grad[dead] == 0.0).all())


# --------------------------------------------------------------------------- MultiHeadAttention


def test_permutation_equivariance_without_positions() -> None:
    torch.manual_seed(15)
    mha = MultiHeadAttention(d_model=16, n_heads=4).eval()
    x = torch.randn(2, 7, 16, generator=_gen(16))
    perm = torch.randperm(7, generator=_gen(17))
    with torch.no_grad():
        out, _ = mha(x)
        out_perm, _ = mha(x[:, perm])
        out_w, weights = mha(x, return_weights=True)
        out_w_perm, weights_perm = mha(x[:, perm], return_weights=True)
    assert_close(out_perm, out[:, perm])
    assert_close(out_w_perm, out_w[:, perm])
    # the weights permute on both axes
    assert_close(weights_perm, weights[:, :, perm][:, :, :, perm])


@pytest.mark.parametrize("return_weights", [False, True])
def test_future_tokens_do_not_change_past_outputs(return_weights: bool) -> None:
    torch.manual_seed(18)
    n = 6
    mha = MultiHeadAttention(d_model=12, n_heads=3).eval()
    mask = causal_mask(n)
    x = torch.randn(2, n, 12, generator=_gen(19))
    with torch.no_grad():
        out, weights = mha(x, mask=mask, return_weights=return_weights)
        for t in range(n):
            x2 = x.clone()
            x2[:, t + 1 :] = torch.randn(2, n - t - 1, 12, generator=_gen(100 + t)) * 5
            out2, _ = mha(x2, mask=mask, return_weights=return_weights)
            assert_close(out2[:, : t + 1], out[:, : t + 1])
            if t < n - 1:
                assert not torch.allclose(out2[:, t + 1 :], out[:, t + 1 :])
    if return_weights:
        above = torch.ones(n, n, dtype=torch.bool).triu(diagonal=1)
        assert bool((weights[..., above] == 0.0).all())
        assert_close(weights.sum(-1), torch.ones(2, 3, n))


def test_dropout_only_in_training() -> None:
    torch.manual_seed(20)
    mha = MultiHeadAttention(d_model=16, n_heads=2, dropout=0.5)
    x = torch.randn(3, 5, 16, generator=_gen(21))
    mha.eval()
    with torch.no_grad():
        ref, _ = mha(x)
        for seed in (1, 2, 3):
            torch.manual_seed(seed)
            assert_close(mha(x)[0], ref, **EXACT)
            torch.manual_seed(seed)
            assert_close(mha(x, return_weights=True)[0], ref, **FP32_TOL)
        mha.train()
        for return_weights in (False, True):
            torch.manual_seed(22)
            a, _ = mha(x, return_weights=return_weights)
            torch.manual_seed(22)
            b, _ = mha(x, return_weights=return_weights)
            torch.manual_seed(23)
            c, _ = mha(x, return_weights=return_weights)
            assert_close(a, b, **EXACT)  # reproducible under a seed
            assert not torch.allclose(a, ref, atol=1e-3)  # dropout did something
            assert not torch.allclose(a, c, atol=1e-3)  # and depends on the seed


# --------------------------------------------------------------------------- property tests


@st.composite
def attention_problems(draw):
    batch = draw(st.integers(1, 3))
    heads = draw(st.integers(1, 4))
    n = draw(st.integers(1, 9))
    m = draw(st.integers(1, 9))
    d_k = draw(st.integers(1, 16))
    d_v = draw(st.integers(1, 16))
    seed = draw(st.integers(0, 2**31 - 1))
    mask_kind = draw(st.sampled_from(["none", "full", "query-key", "padding"]))
    density = draw(st.sampled_from([0.0, 0.2, 0.5, 0.9, 1.0]))
    dead_rows = draw(st.lists(st.integers(0, n - 1), max_size=n))
    use_bias = draw(st.booleans())
    scale = draw(st.sampled_from([None, 1.0, 0.3]))
    return batch, heads, n, m, d_k, d_v, seed, mask_kind, density, dead_rows, use_bias, scale


@settings(max_examples=50, deadline=None)
@given(attention_problems())
def test_paths_agree_and_are_finite(problem) -> None:
    B, H, n, m, d_k, d_v, seed, mask_kind, density, dead_rows, use_bias, scale = problem
    q, k, v = _qkv((B, H), n, m, d_k, d_v, seed=seed)
    g = _gen(seed + 1)
    mask = None
    if mask_kind == "full":
        mask = torch.rand(B, H, n, m, generator=g) < density
        mask[..., dead_rows, :] = False
    elif mask_kind == "query-key":
        mask = torch.rand(n, m, generator=g) < density
        mask[dead_rows, :] = False
    elif mask_kind == "padding":
        mask = (torch.rand(B, 1, 1, m, generator=g) < density) if density > 0 else None
    bias = torch.randn(1, H, n, m, generator=g) if use_bias else None

    out_math, weights = attention_math(q, k, v, mask, scale=scale, bias=bias)
    out_fused = attention_fused(q, k, v, mask, scale=scale, bias=bias)
    assert bool(out_math.isfinite().all())
    assert bool(out_fused.isfinite().all())
    assert bool(weights.isfinite().all())
    assert_close(out_fused, out_math, atol=1e-5, rtol=1e-5)
    if mask is not None:
        alive = mask.expand(B, H, n, m).any(-1)
        assert bool((out_math[~alive] == 0.0).all())
        assert bool((out_fused[~alive] == 0.0).all())
        assert_close(weights.sum(-1)[alive], torch.ones(int(alive.sum())))
        assert bool((weights[~mask.expand(B, H, n, m)] == 0.0).all())


# --------------------------------------------------------------------------- bad input


def _t(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)


BAD_CALLS = {
    # name: (q, k, v, kwargs, regex the message must match, naming the offending value)
    "qk-last-dim": (_t(2, 3, 4), _t(2, 5, 6), _t(2, 5, 4), {}, r"\b4 and 6\b"),
    "kv-length": (_t(2, 3, 4), _t(2, 5, 4), _t(2, 6, 4), {}, r"\b5 and 6\b"),
    "float-mask": (_t(2, 3, 4), _t(2, 5, 4), _t(2, 5, 4), {"mask": _t(3, 5)}, r"torch\.float32"),
    "mask-shape": (
        _t(2, 3, 4),
        _t(2, 5, 4),
        _t(2, 5, 4),
        {"mask": _t(3, 7, dtype=torch.bool)},
        re.escape("(3, 7)"),
    ),
    "mask-more-dims": (
        _t(2, 3, 4),
        _t(2, 5, 4),
        _t(2, 5, 4),
        {"mask": _t(4, 2, 3, 5, dtype=torch.bool)},
        re.escape("(4, 2, 3, 5)"),
    ),
    "mask-widens-scores": (_t(1, 3, 4), _t(1, 5, 4), _t(1, 5, 4), {"bias": _t(2, 3, 5)}, re.escape("(2, 3, 5)")),
    "1d-q": (_t(4), _t(5, 4), _t(5, 4), {}, re.escape("(4,)")),
    "int-q": (_t(3, 4, dtype=torch.int64), _t(5, 4), _t(5, 4), {}, r"torch\.int64"),
    "dropout-1": (_t(3, 4), _t(5, 4), _t(5, 4), {"dropout_p": 1.0}, r"\b1\.0\b"),
    "scale-0": (_t(3, 4), _t(5, 4), _t(5, 4), {"scale": 0}, r"\b0(\.0)?\b"),
    "scale-nan": (_t(3, 4), _t(5, 4), _t(5, 4), {"scale": float("nan")}, r"\bnan\b"),
    "scale-negative": (_t(3, 4), _t(5, 4), _t(5, 4), {"scale": -2.0}, r"-2\.0"),
    "zero-keys": (_t(3, 4), _t(0, 4), _t(0, 4), {}, r"\bm\s*=\s*0\b"),
}


@pytest.mark.parametrize(
    "fn",
    [attention_math, attention_fused, scaled_dot_product_attention],
    ids=["math", "fused", "front"],
)
@pytest.mark.parametrize("case", list(BAD_CALLS), ids=list(BAD_CALLS))
def test_bad_input_raises_value_error(fn, case: str) -> None:
    q, k, v, kwargs, pattern = BAD_CALLS[case]
    with pytest.raises(ValueError, match=pattern):
        fn(q, k, v, **kwargs)


def test_mha_bad_head_count_names_both_values() -> None:
    with pytest.raises(ValueError) as info:
        MultiHeadAttention(d_model=10, n_heads=3)
    msg = str(info.value)
    assert re.search(r"\b10\b", msg) and re.search(r"\b3\b", msg), msg


def test_mha_forward_wrong_last_dim() -> None:
    mha = MultiHeadAttention(d_model=16, n_heads=4)
    with pytest.raises(ValueError, match=re.escape("(2, 3, 8)")):
        mha(torch.zeros(2, 3, 8))
    with pytest.raises(ValueError, match=re.escape("(2, 5, 7)")):
        mha(torch.zeros(2, 3, 16), memory=torch.zeros(2, 5, 7))


def test_mha_validation_survives_python_optimize_flag() -> None:
    """The constructor check is a ValueError, not an ``assert``, so -O cannot strip it."""
    script = textwrap.dedent(
        """
        import sys
        assert False, "asserts must be stripped under -O"
        from attnkit.nn.attention import MultiHeadAttention
        try:
            MultiHeadAttention(d_model=10, n_heads=3)
        except ValueError as e:
            msg = str(e)
            sys.exit(0 if ("10" in msg and "3" in msg) else 3)
        sys.exit(2)
        """
    )
    proc = subprocess.run([sys.executable, "-O", "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)


@pytest.mark.parametrize("n", [16, 160])  # 16² scores: the math kernel under autograd; 160²: flash
def test_fused_gradients_equal_math_on_either_kernel(n: int) -> None:
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(3, 2, n, 8, generator=g) for _ in range(3))
    mask = torch.ones(3, 1, 1, n, dtype=torch.bool)
    mask[1, ..., n // 2 :] = False
    grads = []
    for path in (attention_fused, lambda *a: attention_math(*a)[0]):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = path(*leaves, mask)
        out.backward(torch.ones_like(out) + torch.arange(8.0))
        grads.append([out.detach(), *(t.grad for t in leaves)])
    for fused, math_path in zip(*grads, strict=True):
        torch.testing.assert_close(fused, math_path, atol=1e-5, rtol=1e-4)
