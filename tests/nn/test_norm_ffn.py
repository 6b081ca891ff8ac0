"""Normalisation, the feed-forward network and Add & Norm (chapter §The Transformer Block):
each against its equation written out by hand with the module's own parameters."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.testing import assert_close

from attnkit.nn import AddNorm, FeedForward, LayerNorm, RMSNorm
from attnkit.nn.norm import make_norm

D, D_FF = 24, 40
ATOL, RTOL = 1e-5, 1e-5


def _x(*shape: int, scale: float = 3.0, shift: float = 1.5) -> Tensor:
    torch.manual_seed(0)
    return torch.randn(*shape) * scale + shift  # off-centre and wide, so μ and σ matter


@torch.no_grad()
def _random_affine(norm: nn.Module) -> nn.Module:
    torch.manual_seed(1)
    norm.gamma.copy_(1.0 + 0.5 * torch.randn_like(norm.gamma))
    if getattr(norm, "beta", None) is not None:
        norm.beta.copy_(0.5 * torch.randn_like(norm.beta))
    return norm


def layernorm_formula(x: Tensor, gamma: Tensor, beta: Tensor | None, eps: float) -> Tensor:
    """[eq:att-layernorm]: γ ⊙ (x - μ)/σ + β, μ = mean, σ² = (1/d) Σ (x_i - μ)² (biased),
    σ = √(σ² + eps)."""
    d = x.shape[-1]
    mu = x.sum(dim=-1, keepdim=True) / d
    var = ((x - mu) ** 2).sum(dim=-1, keepdim=True) / d
    out = gamma * (x - mu) / torch.sqrt(var + eps)
    return out if beta is None else out + beta


# --------------------------------------------------------------------------- norms


@pytest.mark.parametrize("eps", [1e-5, 1e-12, 0.5])
@torch.no_grad()
def test_layernorm_matches_formula_and_torch(eps: float) -> None:
    x = _x(3, 5, D)
    ln = _random_affine(LayerNorm(D, eps=eps))
    assert_close(ln(x), layernorm_formula(x, ln.gamma, ln.beta, eps), atol=ATOL, rtol=RTOL)

    ref = nn.LayerNorm(D, eps=eps)
    ref.weight.copy_(ln.gamma)
    ref.bias.copy_(ln.beta)
    assert_close(ln(x), ref(x), atol=ATOL, rtol=RTOL)

    # with a large eps the formula's choices show: biased variance, eps inside the √
    if eps == 0.5:
        centred = x - x.mean(-1, keepdim=True)
        unbiased_var = centred / torch.sqrt(x.var(-1, keepdim=True, correction=1) + eps)
        eps_outside = centred / (x.std(-1, keepdim=True, correction=0) + eps)
        plain = layernorm_formula(x, torch.ones(D), None, eps)
        assert not torch.allclose(unbiased_var, plain, atol=1e-4)
        assert not torch.allclose(eps_outside, plain, atol=1e-4)


@torch.no_grad()
def test_layernorm_without_bias() -> None:
    ln = _random_affine(LayerNorm(D, bias=False))
    assert ln.beta is None and [n for n, _ in ln.named_parameters()] == ["gamma"]
    x = _x(4, D)
    assert_close(ln(x), layernorm_formula(x, ln.gamma, None, ln.eps), atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("eps", [1e-6, 0.5])
@torch.no_grad()
def test_rmsnorm_matches_formula(eps: float) -> None:
    x = _x(3, 5, D)
    rms = _random_affine(RMSNorm(D, eps=eps))
    assert [n for n, _ in rms.named_parameters()] == ["gamma"]  # no β, no centring
    expected = x / torch.sqrt((x**2).mean(dim=-1, keepdim=True) + eps) * rms.gamma
    assert_close(rms(x), expected, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("kind", ["layer", "rms"])
@torch.no_grad()
def test_norms_in_bf16_stay_finite_and_keep_dtype(kind: str) -> None:
    norm = _random_affine(make_norm(kind, D, 1e-6)).to(torch.bfloat16)
    x32 = _x(2, 7, D, scale=300.0, shift=1000.0)  # large values: a bf16 x² sum would be coarse
    x = x32.to(torch.bfloat16)
    y = norm(x)
    assert y.dtype == torch.bfloat16
    assert torch.isfinite(y).all()
    ref = make_norm(kind, D, 1e-6)
    ref.load_state_dict({k: v.float() for k, v in norm.state_dict().items()})
    assert_close(y.float(), ref(x.float()), atol=0.1, rtol=2e-2)


@torch.no_grad()
def test_layernorm_fp32_weights_bf16_input_keeps_dtype() -> None:
    """Mixed precision (weights fp32, activations bf16) keeps LayerNorm's output in bf16."""
    x = _x(2, 3, D).to(torch.bfloat16)
    y = LayerNorm(D)(x)
    assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()


def test_make_norm_rejects_unknown_and_bad_args() -> None:
    assert isinstance(make_norm("layer", D, 1e-5), LayerNorm)
    assert isinstance(make_norm("rms", D, 1e-6), RMSNorm)
    with pytest.raises(ValueError, match="norm"):
        make_norm("batch", D, 1e-5)  # type: ignore[arg-type]
    for cls in (LayerNorm, RMSNorm):
        with pytest.raises(ValueError):
            cls(0)
        with pytest.raises(ValueError):
            cls(D, eps=0.0)


# --------------------------------------------------------------------------- FFN


def _ffn(**kwargs: object) -> FeedForward:
    torch.manual_seed(2)
    ffn = FeedForward(D, D_FF, **kwargs).eval()  # type: ignore[arg-type]
    with torch.no_grad():
        for p in ffn.parameters():  # non-zero biases, so b_1 and b_2 matter
            p.copy_(torch.randn_like(p) * 0.3)
    return ffn


def _affine(x: Tensor, lin: nn.Linear) -> Tensor:
    """x W + b with W = lin.weight.T (torch stores (out, in))."""
    out = x @ lin.weight.T
    return out if lin.bias is None else out + lin.bias


@torch.no_grad()
def test_ffn_relu_matches_chapter_equation() -> None:
    ffn = _ffn()
    x = _x(3, 4, D)
    W1, b1, W2, b2 = ffn.w_1.weight.T, ffn.w_1.bias, ffn.w_2.weight.T, ffn.w_2.bias
    expected = torch.maximum(torch.zeros(()), x @ W1 + b1) @ W2 + b2  # [eq:att-ffn]
    assert_close(ffn(x), expected, atol=ATOL, rtol=RTOL)
    # position-wise: each position alone gives the same row
    assert_close(ffn(x[:, 2:3]), ffn(x)[:, 2:3], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize(
    ("activation", "fn"),
    [
        ("gelu", lambda h: 0.5 * h * (1 + torch.erf(h / 2**0.5))),
        ("gelu_tanh", lambda h: 0.5 * h * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (h + 0.044715 * h**3)))),
        ("silu", lambda h: h * torch.sigmoid(h)),
    ],
)
@torch.no_grad()
def test_ffn_activations(activation: str, fn: Callable[[Tensor], Tensor]) -> None:
    ffn = _ffn(activation=activation)
    x = _x(2, 3, D)
    expected = _affine(fn(_affine(x, ffn.w_1)), ffn.w_2)
    assert_close(ffn(x), expected, atol=ATOL, rtol=RTOL)


@torch.no_grad()
def test_ffn_gated_geglu() -> None:
    ffn = _ffn(activation="gelu_tanh", gated=True)
    assert ffn.w_3 is not None and ffn.w_3.weight.shape == (D_FF, D)
    x = _x(2, 3, D)
    hidden = F.gelu(_affine(x, ffn.w_1), approximate="tanh") * _affine(x, ffn.w_3)
    assert_close(ffn(x), _affine(hidden, ffn.w_2), atol=ATOL, rtol=RTOL)
    # the gate matters: without w_3 the result differs
    assert not torch.allclose(ffn(x), _affine(F.gelu(_affine(x, ffn.w_1), approximate="tanh"), ffn.w_2), atol=1e-3)


@torch.no_grad()
def test_ffn_without_bias() -> None:
    ffn = _ffn(bias=False, gated=True, activation="silu")
    names = {n for n, _ in ffn.named_parameters()}
    assert names == {"w_1.weight", "w_2.weight", "w_3.weight"}
    assert all(lin.bias is None for lin in (ffn.w_1, ffn.w_2, ffn.w_3))
    x = _x(2, 3, D)
    expected = (F.silu(x @ ffn.w_1.weight.T) * (x @ ffn.w_3.weight.T)) @ ffn.w_2.weight.T
    assert_close(ffn(x), expected, atol=ATOL, rtol=RTOL)
    assert torch.equal(ffn(torch.zeros(1, 1, D)), torch.zeros(1, 1, D))


def test_ffn_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="activation"):
        FeedForward(D, D_FF, activation="tanh")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        FeedForward(0, D_FF)
    with pytest.raises(ValueError, match="dropout"):
        FeedForward(D, D_FF, dropout=1.0)


def test_ffn_dropout_on_hidden_only_in_training() -> None:
    ffn = _ffn(dropout=0.5)
    x = _x(2, 3, D)
    with torch.no_grad():
        expected = _affine(F.relu(_affine(x, ffn.w_1)), ffn.w_2)
        assert_close(ffn.eval()(x), expected, atol=ATOL, rtol=RTOL)
        torch.manual_seed(3)
        assert not torch.allclose(ffn.train()(x), expected, atol=1e-3)


# --------------------------------------------------------------------------- Add & Norm


def _sublayer() -> nn.Module:
    torch.manual_seed(4)
    return nn.Sequential(nn.Linear(D, D), nn.Tanh())


@pytest.mark.parametrize("norm_first", [False, True], ids=["postLN", "preLN"])
@torch.no_grad()
def test_addnorm(norm_first: bool) -> None:
    add_norm = AddNorm(D, dropout=0.0, norm_first=norm_first).eval()
    _random_affine(add_norm.norm)
    f = _sublayer()
    x = _x(2, 5, D)
    gamma, beta, eps = add_norm.norm.gamma, add_norm.norm.beta, add_norm.norm.eps

    def ln(t: Tensor) -> Tensor:
        return layernorm_formula(t, gamma, beta, eps)

    # post-LN [eq:att-addnorm]: LN(x + F(x)); pre-LN: x + F(LN(x))
    expected = x + f(ln(x)) if norm_first else ln(x + f(x))
    assert_close(add_norm(x, f), expected, atol=ATOL, rtol=RTOL)
    other = ln(x + f(x)) if norm_first else x + f(ln(x))
    assert not torch.allclose(add_norm(x, f), other, atol=1e-3)


@torch.no_grad()
def test_addnorm_rms_and_validation() -> None:
    add_norm = AddNorm(D, dropout=0.0, norm_first=True, norm="rms", eps=1e-6).eval()
    assert isinstance(add_norm.norm, RMSNorm)
    f = _sublayer()
    x = _x(2, 5, D)
    normed = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-6) * add_norm.norm.gamma
    assert_close(add_norm(x, f), x + f(normed), atol=ATOL, rtol=RTOL)
    with pytest.raises(ValueError, match="dropout"):
        AddNorm(D, dropout=1.5, norm_first=False)
