"""Position information (chapter §Positional Encoding): the sinusoidal table against its
closed form [eq:att-pe-sin][eq:att-pe-cos], the rotation property [prop:att-pe-linear],
learned embeddings, T5's relative buckets against two independent references, and rotary
embeddings."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch.testing import assert_close

from attnkit.nn import (
    LearnedPositionalEmbedding,
    RelativePositionBias,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    relative_position_bucket,
    sinusoidal_table,
)


def _load_reference(name: str) -> ModuleType:
    """Import tests/reference/<name>.py by path (the test folders are not packages)."""
    path = Path(__file__).resolve().parents[1] / "reference" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_reference_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


t5_buckets = _load_reference("t5_buckets")


def omega(i: int, d_model: int, base: float = 10000.0) -> float:
    """The angular frequency of pair i: 1 / base^(2i/d_model)."""
    return 1.0 / base ** (2 * i / d_model)


# --------------------------------------------------------------------------- sinusoidal


@pytest.mark.parametrize("d_model", [8, 64, 130])
def test_sinusoidal_matches_closed_form(d_model: int) -> None:
    positions = [0, 1, 2, 7, 50, 511, 1000, 4095]
    n = max(positions) + 1
    table = sinusoidal_table(n, d_model)
    halves = sinusoidal_table(n, d_model, layout="halves")
    assert table.shape == halves.shape == (n, d_model)
    assert table.dtype == halves.dtype == torch.float32
    half = d_model // 2
    for pos in positions:
        for i in range(half):
            angle = pos / 10000 ** (2 * i / d_model)
            s, c = math.sin(angle), math.cos(angle)
            # [eq:att-pe-sin] at column 2i, [eq:att-pe-cos] at 2i+1
            assert abs(table[pos, 2 * i].item() - s) < 1e-6, (pos, i)
            assert abs(table[pos, 2 * i + 1].item() - c) < 1e-6, (pos, i)
            # halves: all sines, then all cosines
            assert abs(halves[pos, i].item() - s) < 1e-6, (pos, i)
            assert abs(halves[pos, half + i].item() - c) < 1e-6, (pos, i)
    # the two layouts are a permutation of the same numbers
    perm = [*range(0, d_model, 2), *range(1, d_model, 2)]
    assert torch.equal(halves, table[:, perm])


def test_sinusoidal_table_offset_and_validation() -> None:
    assert torch.equal(sinusoidal_table(10, 16, offset=30), sinusoidal_table(40, 16)[30:])
    assert torch.equal(sinusoidal_table(1, 16)[0, 1::2], torch.ones(8))  # pos 0: cos 0 = 1
    assert torch.equal(sinusoidal_table(1, 16)[0, 0::2], torch.zeros(8))
    for bad in (0, 7, -2):
        with pytest.raises(ValueError, match="even d_model"):
            sinusoidal_table(4, bad)
    with pytest.raises(ValueError, match="layout"):
        sinusoidal_table(4, 8, layout="stacked")  # type: ignore[arg-type]


@pytest.mark.parametrize("k", [1, 5, 37, 300])
def test_relative_offset_is_a_rotation(k: int) -> None:
    """[prop:att-pe-linear]: with a = pos·ω_i and b = k·ω_i, the angle-addition formulas give

        sin(a + b) =  cos(b)·sin(a) + sin(b)·cos(a)
        cos(a + b) = -sin(b)·sin(a) + cos(b)·cos(a)

    so (PE[pos+k, 2i], PE[pos+k, 2i+1]) = R(k·ω_i) @ (PE[pos, 2i], PE[pos, 2i+1]) with
    R(θ) = [[cos θ, sin θ], [-sin θ, cos θ]]: a rotation by -θ in the (sin, cos) plane that
    depends on k and i only, never on pos.
    """
    d_model, n_pos = 64, 400
    table = sinusoidal_table(n_pos + k, d_model).double()  # attnkit's float32 values
    w = torch.tensor([omega(i, d_model) for i in range(d_model // 2)], dtype=torch.float64)
    theta = k * w  # (d/2,)
    R = torch.stack(
        [
            torch.stack([theta.cos(), theta.sin()], dim=-1),
            torch.stack([-theta.sin(), theta.cos()], dim=-1),
        ],
        dim=-2,
    )  # (d/2, 2, 2), one rotation per pair i
    pairs = table.unflatten(-1, (-1, 2))  # (n_pos + k, d/2, 2): (sin, cos) per pair
    now, later = pairs[:n_pos], pairs[k : k + n_pos]
    rotated = torch.einsum("iab,pib->pia", R, now)  # R_i @ pair, for every pos and i
    assert (rotated - later).abs().max().item() < 1e-5
    # the opposite sign convention would be wrong wherever sin(k·ω_i) is not ~0
    wrong = torch.einsum("iab,pib->pia", R.transpose(-1, -2), now)
    assert (wrong - later).abs().max().item() > 0.1


def test_sinusoidal_module_offsets_and_growth() -> None:
    d_model = 16
    pe = SinusoidalPositionalEncoding(d_model)
    assert list(pe.parameters()) == []
    assert pe.table.shape == (512, d_model)
    assert torch.equal(pe(10), sinusoidal_table(10, d_model))
    assert torch.equal(pe(7, offset=100), sinusoidal_table(7, d_model, offset=100))
    assert torch.equal(pe(1, offset=511), sinusoidal_table(512, d_model)[511:])

    # beyond the initial 512 positions the table grows
    out = pe(100, offset=500)
    assert out.shape == (100, d_model)
    assert pe.table.shape[0] >= 600
    assert_close(out, sinusoidal_table(100, d_model, offset=500), atol=1e-6, rtol=0)
    long = pe(3000)
    assert long.shape == (3000, d_model)
    assert_close(long, sinusoidal_table(3000, d_model), atol=1e-6, rtol=0)
    # earlier positions are unchanged by growing
    assert torch.equal(pe(10), sinusoidal_table(10, d_model))

    halves = SinusoidalPositionalEncoding(d_model, layout="halves")
    assert torch.equal(halves(600)[:, 0], sinusoidal_table(600, d_model, layout="halves")[:, 0])
    with pytest.raises(ValueError):
        SinusoidalPositionalEncoding(15)


def test_sinusoidal_module_keeps_dtype_when_growing() -> None:
    pe = SinusoidalPositionalEncoding(16).to(torch.bfloat16)
    assert pe(10).dtype == torch.bfloat16
    assert pe(600).dtype == torch.bfloat16
    assert pe(10).dtype == torch.bfloat16


# --------------------------------------------------------------------------- learned


def test_learned_positional_embedding() -> None:
    torch.manual_seed(0)
    emb = LearnedPositionalEmbedding(max_len=16, d_model=8)
    assert emb.weight.shape == (16, 8)
    assert torch.equal(emb(5, offset=3), emb.weight[3:8])
    assert torch.equal(emb(16), emb.weight)
    emb(5).sum().backward()
    assert emb.weight.grad is not None and emb.weight.grad[:5].eq(1).all()
    assert emb.weight.grad[5:].eq(0).all()
    with pytest.raises(ValueError, match="max_len"):
        emb(17)
    with pytest.raises(ValueError, match="max_len"):
        emb(4, offset=13)
    with pytest.raises(ValueError):
        LearnedPositionalEmbedding(0, 8)


# --------------------------------------------------------------------------- T5 relative


SETTINGS = [(32, 128), (64, 256), (16, 40), (8, 20)]


@pytest.mark.parametrize("bidirectional", [True, False], ids=["bidirectional", "causal"])
@pytest.mark.parametrize(("num_buckets", "max_distance"), SETTINGS)
def test_t5_relative_buckets_match_reference(bidirectional: bool, num_buckets: int, max_distance: int) -> None:
    positions = list(range(-300, 301))
    got = relative_position_bucket(torch.tensor(positions), bidirectional, num_buckets, max_distance)
    assert got.dtype == torch.long
    expected = t5_buckets.buckets(positions, bidirectional, num_buckets, max_distance)
    mismatches = [(r, e, g) for r, e, g in zip(positions, expected, got.tolist(), strict=True) if e != g]
    assert not mismatches, f"(relative position, oracle, attnkit): {mismatches[:10]}"
    assert min(expected) >= 0 and max(expected) <= num_buckets - 1

    # a second, independent reference: Hugging Face's port of mesh-tensorflow
    modeling_t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    hf = modeling_t5.T5Attention._relative_position_bucket(
        torch.tensor(positions),
        bidirectional=bidirectional,
        num_buckets=num_buckets,
        max_distance=max_distance,
    )
    assert torch.equal(got, hf)


def test_t5_reference_oracle_sanity() -> None:
    """A few values worked out by hand, so the oracle itself is pinned down."""
    b = t5_buckets.bucket
    # bidirectional, 32 buckets: 16 per direction, exact below 8
    assert [b(r, True, 32, 128) for r in (0, -1, -7, 1, 7)] == [0, 1, 7, 17, 23]
    assert b(-128, True, 32, 128) == b(-10_000, True, 32, 128) == 15
    assert b(128, True, 32, 128) == 31
    # causal: the future collapses to bucket 0, exact below 16
    assert [b(r, False, 32, 128) for r in (5, 0, -1, -15)] == [0, 0, 1, 15]
    assert b(-16, False, 32, 128) == 16
    assert b(-10_000, False, 32, 128) == 31


def test_relative_position_bias_uses_the_buckets() -> None:
    torch.manual_seed(0)
    n_heads, n, m, offset = 3, 4, 9, 5
    rpb = RelativePositionBias(n_heads, num_buckets=16, max_distance=32, bidirectional=False)
    bias = rpb(n, m, offset=offset)
    assert bias.shape == (1, n_heads, n, m)
    for q in range(n):
        for key in range(m):
            bucket = t5_buckets.bucket(key - (offset + q), False, 16, 32)
            assert torch.equal(bias[0, :, q, key], rpb.embedding.weight[bucket])
    with pytest.raises(ValueError):
        RelativePositionBias(n_heads, num_buckets=2)


@pytest.mark.parametrize("max_distance", [12, 16])
def test_causal_relative_bias_rejects_max_distance_below_max_exact(max_distance: int) -> None:
    with pytest.raises(ValueError, match="max_distance"):
        RelativePositionBias(2, num_buckets=32, max_distance=max_distance, bidirectional=False)
    RelativePositionBias(2, num_buckets=32, max_distance=max_distance, bidirectional=True)(1, 40, offset=39)


# --------------------------------------------------------------------------- rotary


@pytest.mark.parametrize("dim", [2, 16, 64])
def test_rotary_depends_only_on_offset(dim: int) -> None:
    """⟨R(p)q, R(p')k⟩ = ⟨R(p+s)q, R(p'+s)k⟩: the score sees only p' - p."""
    torch.manual_seed(0)
    rot = RotaryEmbedding(dim)
    q, k = torch.randn(dim), torch.randn(dim)
    T = 40

    def gram(shift: int) -> torch.Tensor:
        """G[p, p'] = ⟨R(p+shift) q, R(p'+shift) k⟩ for p, p' in 0 .. T-1."""
        rq = rot(q.expand(T, dim), offset=shift)  # (T, dim): q at positions shift .. shift+T-1
        rk = rot(k.expand(T, dim), offset=shift)
        return rq @ rk.T

    base = gram(0)
    for s in (1, 3, 17, 100):
        assert_close(gram(s), base, atol=1e-4, rtol=1e-4)
    # within one Gram matrix: every diagonal is constant (Toeplitz)
    for s in (1, 5, 20):
        assert_close(base[s:, s:], base[:-s, :-s], atol=1e-4, rtol=1e-4)
    # and it does depend on the offset p' - p (unless dim is tiny and the angles alias)
    assert not torch.allclose(base[0, 1], base[0, 0], atol=1e-3)


def test_rotary_is_a_rotation_of_each_pair() -> None:
    torch.manual_seed(0)
    dim, T, offset = 8, 5, 3
    rot = RotaryEmbedding(dim)
    x = torch.randn(2, T, dim)
    y = rot(x, offset=offset)
    assert y.shape == x.shape
    # norms of each (2i, 2i+1) pair are kept
    assert_close(y.unflatten(-1, (-1, 2)).norm(dim=-1), x.unflatten(-1, (-1, 2)).norm(dim=-1))
    # position 0 is the identity; otherwise pair i turns by pos·ω_i, counterclockwise
    assert torch.equal(rot(x, offset=0)[:, 0], x[:, 0])
    for t in range(T):
        for i in range(dim // 2):
            a = (offset + t) * omega(i, dim)
            e, o = x[:, t, 2 * i], x[:, t, 2 * i + 1]
            assert_close(y[:, t, 2 * i], e * math.cos(a) - o * math.sin(a), atol=1e-5, rtol=1e-5)
            assert_close(y[:, t, 2 * i + 1], e * math.sin(a) + o * math.cos(a), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        RotaryEmbedding(7)
