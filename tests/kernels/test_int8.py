"""The int8 kernel of attnkit.kernels: the AVX2 C code (forced, where this CPU runs it) equal to
its PyTorch reference on odd shapes at batch 1 and 8; the reference equal to the product of the
dequantised activations and weights; a kernel that cannot run named in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from attnkit import kernels
from attnkit.models.weights import quantize

needs_avx2 = pytest.mark.skipif(not kernels.available("avx2"), reason="this CPU or machine cannot run the AVX2 kernel")


def operands(m: int, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (m, k padded), the int8 weights q (n, k padded) with block scales (n, k / 32), and the fp32
    weights (n, k)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.linspace(0.1, 2.0, n)[:, None]
    x = torch.randn(m, k, generator=g) * 3
    x[0, :5] = 0.0  # a block with zeros in it
    q, scales = quantize(w, blocks=True)
    return F.pad(x, (0, q.shape[1] - k)), q, scales, w


@needs_avx2
@pytest.mark.parametrize("m", [1, 8])
@pytest.mark.parametrize(("n", "k"), [(37, 50), (129, 100), (5, 32), (300, 777)])
def test_the_avx2_kernel_equals_the_reference(m: int, n: int, k: int) -> None:
    x, q, scales, _ = operands(m, n, k)
    expected = kernels.int8_matmul(x, q, scales, kernel="reference")
    got = kernels.int8_matmul(x, q, scales, kernel="avx2")
    assert got.shape == (m, n) and got.dtype == torch.float32
    assert_close(got, expected, atol=1e-5 * expected.abs().max().item(), rtol=1e-5)
    assert_close(kernels.int8_matmul(x, q, scales), expected, atol=1e-5 * expected.abs().max().item(), rtol=1e-5)


@pytest.mark.parametrize("m", [1, 8])
def test_the_reference_is_the_dequantised_product(m: int) -> None:
    x, q, scales, w = operands(m, 64, 100)
    xq, xd = kernels.quantize_blocks(x)
    assert int(xq.abs().max()) == 127 and xq.dtype == torch.int8
    assert (xq.view(m, -1, 32).abs().amax(-1)[xd > 0] == 127).all()  # each block uses its range
    dequantised = (xq.float().view(m, -1, 32) * xd[..., None]).view(m, -1)
    assert (dequantised - x).abs().max() <= xd.max() / 2 + 1e-6  # within half a step
    weights = (q.double().view(len(q), -1, 32) * scales.double()[..., None]).view(len(q), -1)
    assert ((weights[:, :100] - w.double()).abs() <= scales.double().repeat_interleave(32, 1)[:, :100] / 2 + 1e-6).all()
    expected = dequantised.double() @ weights.T
    assert_close(kernels.int8_matmul_reference(x, q, scales).double(), expected, atol=1e-4, rtol=1e-5)


def test_a_kernel_that_cannot_run_is_named_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x, q, scales, _ = operands(1, 4, 32)
    with pytest.raises(ValueError, match="kernel='neon' is not an int8 kernel; use one of auto, avx2, reference"):
        kernels.int8_matmul(x, q, scales, kernel="neon")
    with pytest.raises(ValueError, match="need one k, a multiple of 32"):
        kernels.int8_matmul(x[:, :31], q[:, :31], scales)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler")
    kernels._build.cache_clear()
    kernels._auto.cache_clear()
    try:
        if not {"avx2", "fma"} <= kernels.cpu_flags():
            pytest.skip("this CPU has no AVX2: the missing feature is the error, tested below")
        with pytest.raises(kernels.KernelUnavailableError, match="there is no C compiler \\('no-such-compiler'\\)"):
            kernels.int8_matmul(x, q, scales, kernel="avx2")
        reference = kernels.int8_matmul(x, q, scales, kernel="reference")
        assert_close(kernels.int8_matmul(x, q, scales), reference)  # auto falls back
    finally:
        kernels._build.cache_clear()
        kernels._auto.cache_clear()
    monkeypatch.setattr(kernels, "cpu_flags", lambda: frozenset({"sse2"}))
    try:
        with pytest.raises(kernels.KernelUnavailableError, match="needs avx2, fma, which this CPU lacks"):
            kernels.int8_matmul(x, q, scales, kernel="avx2")
    finally:
        kernels._build.cache_clear()
