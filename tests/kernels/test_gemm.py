"""The many-row int8 GEMM (attnkit.kernels.gemm): each of PyTorch's two engines, forced, equal to
its arithmetic written out (the activations quantised with PyTorch's own dynamic parameters, the
int8 weights per row, the bias) on odd shapes; a layer of blocks takes it from MANY_ROWS rows on
and the block kernel below, and the many-row weights follow a load; the engine chosen by the
stated rule; a bad choice named in one line."""

from __future__ import annotations

import platform

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from attnkit import kernels
from attnkit.kernels import gemm
from attnkit.machine import CPU_CLASS_ENV
from attnkit.models.weights import QuantizedLMHead
from attnkit.nn.quantized import BlockLinear, products, quantize_rows

x86 = pytest.mark.skipif(
    platform.machine().lower() not in ("x86_64", "amd64"), reason="PyTorch's int8 GEMM engines are x86-64's"
)
needs_c = pytest.mark.skipif(not kernels.available(), reason="this machine cannot build or run its C kernel")
# Each engine where it is exact here: oneDNN's 8-bit activations saturate without VNNI or AMX.
EXACT_ENGINES = [
    pytest.param("onednn", marks=pytest.mark.skipif(not gemm.onednn_exact(), reason="oneDNN has no VNNI or AMX here")),
    "fbgemm",
]


def written_out(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, bias, engine: str) -> torch.Tensor:
    """The GEMM's arithmetic: x quantised to 8 bits (7 on fbgemm) with one scale and zero point as
    PyTorch chooses them, times the int8 rows' weights, plus the bias."""
    xq = torch.quantize_per_tensor_dynamic(x, torch.quint8, engine == "fbgemm")
    return F.linear(xq.dequantize().double(), (q.double() * scales.double()[:, None]), bias).float()


@x86
@pytest.mark.parametrize("engine", EXACT_ENGINES)
@pytest.mark.parametrize(("m", "n", "k"), [(8, 37, 64), (33, 129, 96), (130, 300, 800)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_each_engine_computes_its_arithmetic(engine: str, m: int, n: int, k: int, with_bias: bool) -> None:
    g = torch.Generator().manual_seed(m + n)
    w = torch.randn(n, k, generator=g) * torch.linspace(0.1, 2.0, n)[:, None]
    x = torch.randn(m, k, generator=g) * 3 + 0.5
    bias = torch.randn(n, generator=g) if with_bias else None
    q, scales = quantize_rows(w)
    q = q[:, :k]
    got = gemm.matmul(x, gemm.pack(q, scales, bias, engine), engine)
    expected = written_out(x, q, scales, None if bias is None else bias.double(), engine)
    assert got.shape == (m, n) and got.dtype == torch.float32
    assert_close(got, expected, rtol=1e-5, atol=1e-4 * expected.abs().max().item())
    # and within its quantisation of the unquantised product: half an activation step per input
    step = (x.max() - x.min()) / (127 if engine == "fbgemm" else 255)
    bound = step / 2 * w.abs().sum(1) + (w - q * scales[:, None]).abs().sum(1) * x.abs().max() + 1e-3
    assert ((got - F.linear(x, w, bias)).abs() <= bound).all()


@x86
@needs_c
@pytest.mark.parametrize("engine", EXACT_ENGINES)
@pytest.mark.parametrize("layout", kernels.FORMATS)
def test_a_layer_of_blocks_takes_the_gemm_from_many_rows_on(monkeypatch, engine: str, layout: str) -> None:
    monkeypatch.setenv(gemm.GEMM_ENV, engine)
    g = torch.Generator().manual_seed(3)
    w, bias = torch.randn(70, 100, generator=g), torch.randn(70, generator=g)
    layer = BlockLinear.of(w, layout, bias)
    dequantised = kernels.dequantize(layout, *layer.whole())  # (70, 128): in padded to 32
    q, scales = quantize_rows(dequantised)
    for rows in (1, gemm.MANY_ROWS - 1, gemm.MANY_ROWS, 50):
        x = torch.randn(2, rows, 100, generator=g) if rows > 1 else torch.randn(1, 100, generator=g)
        flat = F.pad(x.reshape(-1, 100), (0, 28))
        if len(flat) >= gemm.MANY_ROWS:
            expected = written_out(flat, q, scales, bias.double(), engine)
        else:
            expected = kernels.block_matmul(flat, layout, *layer.whole(), kernel="reference") + bias
        assert_close(layer(x), expected.reshape(*x.shape[:-1], 70), rtol=1e-5, atol=1e-4 * expected.abs().max().item())


@x86
@needs_c
def test_off_keeps_the_block_kernel_at_every_row_count(monkeypatch) -> None:
    monkeypatch.setenv(gemm.GEMM_ENV, "off")
    w = torch.randn(40, 64, generator=torch.Generator().manual_seed(4))
    layer = BlockLinear.of(w, "q8_0")
    x = torch.randn(20, 64, generator=torch.Generator().manual_seed(5))  # many, under DENSE_ROWS: integer
    expected = kernels.block_matmul(x, "q8_0", *layer.whole(), kernel="reference")
    assert_close(layer(x), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    assert layer._gemm is None


@x86
@needs_c
@pytest.mark.parametrize("engine", EXACT_ENGINES)
def test_the_many_row_weights_follow_a_load_and_the_vocabulary_bias(monkeypatch, engine: str) -> None:
    """Weights loaded into a layer that has made its GEMM weights are the ones multiplied next; a
    vocabulary projection's bias, added inside the GEMM, is its bias as it is now."""
    monkeypatch.setenv(gemm.GEMM_ENV, engine)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(16, 64, generator=g)
    first, second = (BlockLinear.of(torch.randn(48, 64, generator=g), "q8_0") for _ in range(2))
    before = first(x)
    first.load_state_dict(second.state_dict())
    assert_close(first(x), second(x))
    assert not torch.equal(first(x), before)

    class Head:  # an LMHead's parts, which QuantizedLMHead takes over
        transform, scale, bias = None, 1.0, torch.nn.Parameter(torch.randn(48, generator=g), requires_grad=False)

    head = QuantizedLMHead(Head(), second)
    assert_close(head(x, None), second(x) + head.bias, rtol=1e-5, atol=1e-4)
    with torch.no_grad():
        head.bias.add_(1.0)
    assert_close(head(x, None), second(x) + head.bias, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="one layer's output"):
        products(x, (first, second), head.bias)


@x86
@needs_c
@pytest.mark.parametrize("engine", EXACT_ENGINES)
def test_layers_of_one_input_take_one_gemm(monkeypatch, engine: str) -> None:
    """Attention's w_q, w_k, w_v of one input go through one GEMM, their rows stacked and the input
    quantised once: each output is its layer's own GEMM's, with or without a bias; the stacked
    weights are held once, by the first layer, and follow a load into another of them."""
    monkeypatch.setenv(gemm.GEMM_ENV, engine)
    g = torch.Generator().manual_seed(8)
    layers = [
        BlockLinear.of(torch.randn(n, 100, generator=g), "q8_0", torch.randn(n, generator=g) if with_bias else None)
        for n, with_bias in ((48, True), (37, False), (64, True))
    ]
    x = torch.randn(3, 7, 100, generator=g)  # 21 rows: the GEMM's
    for changed in (None, 1, 2):  # as made; after a load into a layer without a bias; into one with
        products(x, layers)  # the stacked weights made (again: the layers alone below make their own)
        if changed is not None:
            n, with_bias = layers[changed].out_features, layers[changed].bias is not None
            bias = torch.randn(n, generator=g) if with_bias else None
            loaded = BlockLinear.of(torch.randn(n, 100, generator=g), "q8_0", bias)
            layers[changed].load_state_dict(loaded.state_dict())
        together = products(x, layers)
        if changed is None:
            assert layers[0]._gemm is not None and all(layer._gemm is None for layer in layers[1:])
        alone = [layer(x) for layer in layers]  # each its own GEMM
        for got, expected in zip(together, alone, strict=True):
            assert got.shape == expected.shape
            assert_close(got, expected)


@x86
def test_the_engine_follows_the_stated_rule(monkeypatch) -> None:
    monkeypatch.delenv(gemm.GEMM_ENV, raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(gemm, "cpu_flags", lambda: frozenset({"avx2", "avx512f", "avx512_bf16", "amx_int8"}))
    monkeypatch.setattr(gemm, "cpu_class", lambda: type("C", (), {"native_bf16": True})())
    assert gemm.engine() == "onednn"
    for isa, engine in (("AVX512_CORE_BF16", "fbgemm"), ("avx512_core_amx", "onednn"), ("ALL", "onednn")):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)  # oneDNN kept from AMX: fbgemm is faster
        assert gemm.engine() == engine
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setattr(gemm, "cpu_flags", lambda: frozenset({"avx2", "avx512f", "avx512_bf16"}))
    assert gemm.engine() == "fbgemm"  # AVX512-BF16 without AMX's int8 tiles
    monkeypatch.setattr(gemm, "cpu_flags", lambda: frozenset({"avx2", "amx_int8"}))
    monkeypatch.setattr(gemm, "cpu_class", lambda: type("C", (), {"native_bf16": False})())
    assert gemm.engine() == "fbgemm"  # a CPU class forced down to AVX2 takes AVX2's engine
    for chosen, engine in (("onednn", "onednn"), ("FBGEMM", "fbgemm"), ("off", None)):
        monkeypatch.setenv(gemm.GEMM_ENV, chosen)
        assert gemm.engine() == engine
    monkeypatch.setenv(gemm.GEMM_ENV, "mkl")
    with pytest.raises(ValueError, match="ATTNKIT_INT8_GEMM=mkl is not an int8 GEMM engine; use onednn, fbgemm or off"):
        gemm.engine()


@x86
def test_onednn_is_refused_where_it_would_saturate(monkeypatch) -> None:
    """Without VNNI or AMX, oneDNN sums pairs of 8-bit activation products in 16 bits, and they
    saturate: forced there, it is refused in one line, and never chosen."""
    monkeypatch.setenv(gemm.GEMM_ENV, "onednn")
    monkeypatch.setattr(gemm, "cpu_flags", lambda: frozenset({"avx2", "avx512f", "amx_int8"}))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    message = "ATTNKIT_INT8_GEMM=onednn would saturate here: oneDNN has no VNNI or AMX on this CPU"
    with pytest.raises(ValueError, match=rf"^{message} \(ONEDNN_MAX_CPU_ISA=AVX2\); use fbgemm or off$"):
        gemm.engine()
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setattr(gemm, "cpu_flags", lambda: frozenset({"avx2", "fma"}))  # an AVX2 CPU
    with pytest.raises(ValueError, match=r"ONEDNN_MAX_CPU_ISA=ALL\); use fbgemm or off$"):
        gemm.engine()
    for flag in ("avx_vnni", "avx512_vnni"):
        monkeypatch.setattr(gemm, "cpu_flags", lambda flag=flag: frozenset({"avx2", flag}))
        assert gemm.engine() == "onednn"


@x86
def test_a_forced_avx2_class_takes_fbgemm(monkeypatch) -> None:
    monkeypatch.delenv(gemm.GEMM_ENV, raising=False)
    monkeypatch.setenv(CPU_CLASS_ENV, "avx2")
    assert gemm.engine() == "fbgemm"


@x86
@needs_c
def test_an_input_with_outliers_keeps_the_block_kernel(monkeypatch) -> None:
    """One scale for a whole input with outlier channels (SmolLM2's: its perplexity rose 1.75x
    through the GEMM) would crush the rest: such an input, spread past MAX_SPREAD, keeps the blocks."""
    monkeypatch.setenv(gemm.GEMM_ENV, "fbgemm")
    g = torch.Generator().manual_seed(7)
    layer = BlockLinear.of(torch.randn(40, 64, generator=g), "q8_0")
    x = torch.randn(20, 64, generator=g)
    assert gemm.suits(x)
    x[0, 3] = 200.0  # an outlier
    assert not gemm.suits(x)
    expected = kernels.block_matmul(x, "q8_0", *layer.whole(), kernel="reference")
    assert_close(layer(x), expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    assert layer._gemm is None
