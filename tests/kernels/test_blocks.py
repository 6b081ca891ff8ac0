"""The block kernel of attnkit.kernels: the machine's C code (AVX2 or NEON, forced, where it runs) equal to
its PyTorch reference for every format on odd shapes at batch 1 and 8, their packed groups too;
Q8_0's and Q4_0's blocks within a step of the weights they quantise, Q4_1's no further from them
than llama.cpp's quantiser puts them; the reference equal to the product of the dequantised
activations and weights; the op's C++ kernel and its Python fallback equal; a
kernel that cannot run named in one line."""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from attnkit import kernels
from attnkit.kernels import blocks, build, ops

needs_c = pytest.mark.skipif(not kernels.available(), reason="this machine cannot build or run its C kernel")


def operands(fmt: str, m: int, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, tuple, torch.Tensor]:
    """x (m, k padded to 32), the weights' blocks (data, d, m) and the fp32 weights (n, k padded)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.linspace(0.1, 2.0, n)[:, None] + torch.linspace(-1, 1, n)[:, None]
    x = torch.randn(m, k, generator=g) * 3
    x[0, :5] = 0.0  # a block with zeros in it
    pad = -k % 32
    w, x = F.pad(w, (0, pad)), F.pad(x, (0, pad))
    w[0, :32] = 0.0  # a block of zeros
    return x, kernels.quantize(w, fmt), w


@needs_c
@pytest.mark.parametrize("fmt", kernels.FORMATS)
@pytest.mark.parametrize("m", [1, 8, kernels.DENSE_ROWS + 3])
@pytest.mark.parametrize(("n", "k"), [(37, 50), (129, 100), (5, 32), (300, 777)])
def test_the_c_kernel_equals_the_reference(fmt: str, m: int, n: int, k: int) -> None:
    x, weight, _ = operands(fmt, m, n, k)
    expected = kernels.block_matmul(x, fmt, *weight, kernel="reference")
    got = kernels.block_matmul(x, fmt, *weight, kernel=kernels.native())
    assert got.shape == (m, n) and got.dtype == torch.float32
    assert_close(got, expected, atol=1e-5 * expected.abs().max().item(), rtol=1e-5)
    assert_close(kernels.block_matmul(x, fmt, *weight), expected, atol=1e-5 * expected.abs().max().item(), rtol=1e-5)


@needs_c
@pytest.mark.parametrize("fmt", kernels.FORMATS)
@pytest.mark.parametrize("m", [1, 8, kernels.DENSE_ROWS + 3])
@pytest.mark.parametrize(("n", "k"), [(37, 50), (129, 100), (8, 32), (300, 777)])
def test_the_packed_blocks_give_the_reference(fmt: str, m: int, n: int, k: int) -> None:
    """The packed groups of 8 rows and the rows after them (:func:`kernels.split`: the weight held
    once) equal the reference, alone and beside unpacked weights in one call, integer at every
    row count."""
    x, weight, _ = operands(fmt, m, n, k)
    *rest, packed = kernels.split(fmt, *weight)
    per_block = {"q8_0": 8 * 32 + 8 * 2, "q4_0": 8 * 16 + 8 * 4, "q4_1": 8 * 16 + 8 * 4}[fmt]  # values, d, (mins)
    assert packed.dtype == torch.uint8 and packed.numel() == (n // 8) * (x.shape[1] // 32) * per_block
    assert rest[0].shape[0] == n % 8 and kernels.rows(fmt, rest[0], packed, x.shape[1]) == n
    expected = kernels.matmul_reference(x, fmt, *weight)
    assert_close(kernels.block_matmul(x, fmt, *rest, kernel="reference", packed=packed), expected)
    got = kernels.block_matmul(x, fmt, *rest, kernel=kernels.native(), packed=packed)
    assert_close(got, expected, atol=1e-5 * expected.abs().max().item(), rtol=1e-5)
    other = operands(fmt, m, 13, k, seed=4)[1]
    both = kernels.block_matmuls(x, fmt, [other, (*rest, packed)], kernel=kernels.native())
    alone = torch.cat([kernels.matmul_reference(x, fmt, *other), expected], dim=-1)
    assert_close(both, alone, atol=1e-5 * alone.abs().max().item(), rtol=1e-5)


@pytest.mark.parametrize("fmt", kernels.FORMATS)
@pytest.mark.parametrize("kernel", [pytest.param(kernels.native(), marks=needs_c), "reference"])
@pytest.mark.parametrize(("n", "k"), [(0, 64), (5, 0), (9, 0), (0, 0)])
def test_an_empty_weight_gives_the_empty_or_zero_product(fmt: str, kernel: str, n: int, k: int) -> None:
    """No rows: an (m, 0) product; no inputs: zeros, as ``F.linear`` gives; split or not, any rows."""
    weight = kernels.quantize(torch.zeros(n, k), fmt)
    assert blocks.dequantize(fmt, *weight).shape == (n, k)
    for m in (1, kernels.DENSE_ROWS):
        x = torch.randn(m, k)
        expected = F.linear(x, torch.zeros(n, k))
        assert_close(kernels.block_matmuls(x, fmt, [weight], kernel=kernel), expected, atol=0, rtol=0)
        assert_close(
            kernels.block_matmuls(x, fmt, [kernels.split(fmt, *weight)], kernel=kernel), expected, atol=0, rtol=0
        )


@pytest.mark.parametrize("fmt", kernels.FORMATS)
def test_packing_rearranges_the_blocks(fmt: str) -> None:
    """Each packed group holds its 8 rows' 4-byte pieces, lane by lane, then their scales and
    (4-bit) minima (q4_0's -8 d): read back by hand, the blocks as they were."""
    _, (data, d, m), _ = operands(fmt, 1, 19, 64)
    packed = kernels.pack(fmt, data, d, m)
    groups, blocks_per_row, pieces_per_block = 2, 2, 8 if fmt == "q8_0" else 4
    size = groups * blocks_per_row * pieces_per_block * 4 * 8
    pieces = packed[:size].view(torch.int32).view(groups, blocks_per_row, pieces_per_block, 8)
    as_stored = pieces.permute(0, 3, 1, 2).reshape(16, -1).contiguous().view(data.dtype)
    assert torch.equal(as_stored, data[:16])
    sides = packed[size:].view(torch.float16).view(-1, groups, blocks_per_row, 8)
    assert len(sides) == (1 if fmt == "q8_0" else 2)
    scales, *mins = (t.permute(0, 2, 1).reshape(16, blocks_per_row) for t in sides)
    assert torch.equal(scales, d[:16])
    if fmt != "q8_0":
        assert torch.equal(mins[0], m[:16] if fmt == "q4_1" else -8 * d[:16])
    assert kernels.pack(fmt, data[:7], d[:7], None if m is None else m[:7]) is None
    unpacked = kernels.unpack(fmt, packed, 64)  # the inverse, bit for bit
    for got, want in zip(unpacked, (data[:16], d[:16], None if m is None else m[:16]), strict=True):
        assert (got is None and want is None) or (got.dtype == want.dtype and torch.equal(got, want))


@needs_c
def test_the_c_kernel_and_pack_agree_on_a_packed_groups_size() -> None:
    size = ops._library().attnkit_packed_bytes  # what the op's C++ kernel counts rows by
    size.restype = ctypes.c_int64
    for code, fmt in enumerate(kernels.FORMATS):
        assert size(code) == kernels.packed_bytes(fmt) == {"q8_0": 272, "q4_0": 160, "q4_1": 160}[fmt]


def test_packed_blocks_that_do_not_fit_are_refused() -> None:
    x, weight, _ = operands("q4_0", 1, 16, 64)
    *rest, packed = kernels.split("q4_0", *weight)
    with pytest.raises(ValueError, match=r"packed holds 3 bytes of torch.uint8 where kernels.pack gives 320 for each"):
        kernels.block_matmul(x, "q4_0", *rest, packed=torch.zeros(3, dtype=torch.uint8))
    q8 = kernels.split("q8_0", *kernels.quantize(torch.ones(16, 64), "q8_0"))
    with pytest.raises(ValueError, match=r"packed holds 640 bytes of torch.uint8 where kernels.pack gives 544 for"):
        kernels.block_matmul(x, "q8_0", *q8[:3], packed=packed)
    with pytest.raises(ValueError, match=r"holds its last n mod 8 rows as blocks, not 16: pass kernels.split's"):
        kernels.block_matmul(x, "q4_0", *weight, packed=packed)


@pytest.mark.parametrize("kernel", [pytest.param(kernels.native(), marks=needs_c), "reference"])
@pytest.mark.parametrize("fmt", kernels.FORMATS)
@pytest.mark.parametrize("m", [1, 8])
def test_several_weights_in_one_call_equal_each_alone(kernel: str, fmt: str, m: int) -> None:
    # q, k and v of unequal widths (grouped-query attention), none a multiple of the 4 rows a group takes
    x, first, _ = operands(fmt, m, 37, 100, seed=1)
    weights = [first, operands(fmt, m, 9, 100, seed=2)[1], operands(fmt, m, 130, 100, seed=3)[1]]
    got = kernels.block_matmuls(x, fmt, weights, kernel=kernel)
    assert got.shape == (m, 37 + 9 + 130)
    alone = torch.cat([kernels.block_matmul(x, fmt, *weight, kernel=kernel) for weight in weights], dim=-1)
    assert_close(got, alone, atol=1e-5 * alone.abs().max().item(), rtol=1e-5)
    with pytest.raises(ValueError, match="block_matmuls takes 1 to 8 weights, not 9"):
        kernels.block_matmuls(x, fmt, weights * 3, kernel=kernel)


@pytest.mark.parametrize("kernel", [pytest.param(kernels.native(), marks=needs_c), "reference"])
@pytest.mark.parametrize("fmt", kernels.FORMATS)
def test_many_rows_meet_the_dequantised_weight_unquantised(kernel: str, fmt: str) -> None:
    x, weight, _ = operands(fmt, kernels.DENSE_ROWS, 37, 100)
    expected = x.double() @ blocks.dequantize(fmt, *weight).double().T
    got = kernels.block_matmul(x, fmt, *weight, kernel=kernel).double()
    assert_close(got, expected, atol=1e-5 * expected.abs().max().item(), rtol=1e-5)


@pytest.mark.parametrize("fmt", kernels.FORMATS)
def test_blocks_hold_the_weights_within_a_step(fmt: str) -> None:
    _, (data, d, m), w = operands(fmt, 1, 64, 96)
    assert data.dtype == (torch.int8 if fmt == "q8_0" else torch.uint8) and d.dtype == torch.float16
    assert data.shape == ((64, 96) if fmt == "q8_0" else (64, 48)) and d.shape == (64, 3)
    assert (m is None) == (fmt != "q4_1")
    values = blocks.integers(fmt, data)  # (64, 3, 32)
    low, high = {"q8_0": (-127, 127), "q4_0": (-8, 7), "q4_1": (0, 15)}[fmt]
    assert int(values.min()) >= low and int(values.max()) <= high
    assert (blocks.dequantize(fmt, data, d, m)[0, :32] == 0).all()  # a block of zeros stays zeros
    if fmt == "q4_1":  # its grids are searched, not spread over the block's range: see below
        return
    step = d.float().abs().repeat_interleave(32, 1)
    # Q4_0 reaches -8 steps towards its extreme and 7 away from it (llama.cpp's): one step there.
    bound = step if fmt == "q4_0" else step / 2
    assert ((blocks.dequantize(fmt, data, d, m) - w).abs() <= bound + 1e-3 * w.abs().max()).all()


def _blockwise_error(approx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (approx - w).double().square().view(len(w), -1, 32).sum(-1)


def _min_max_q4_1(w: torch.Tensor) -> torch.Tensor:
    """llama.cpp's ``quantize_row_q4_1_ref``, dequantised: per block ``d = (max - min) / 15`` and
    ``m = min`` stored in fp16, ``u = round((w - min) / d)`` against the unrounded d."""
    b = w.view(len(w), -1, 32)
    low, high = b.amin(-1, keepdim=True), b.amax(-1, keepdim=True)
    d = (high - low) / 15
    u = torch.where(d > 0, torch.round((b - low) / d), torch.zeros_like(b)).clamp(0, 15)
    return (u * d.half().float() + low.half().float()).view_as(w)


@pytest.mark.parametrize("tails", [None, 3])
def test_q4_1_rounds_no_block_worse_than_llama_cpps_quantiser(tails: int | None) -> None:
    """Against llama.cpp's Q4_1 quantiser (the block's min-max grid; also as the ``gguf`` package
    computes it, where installed), on Gaussian and heavy-tailed (Student's t) weights and blocks
    far from 0: no block's squared error larger, the whole weight's clearly smaller; a constant
    block (fp16-exact) exact."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(96, 256, generator=g) * 0.02
    if tails is not None:  # z / sqrt(chi2 / nu)
        w = w / (torch.randn(tails, 96, 256, generator=g).square().sum(0) / tails).sqrt()
    w[2:10] += 0.5  # offsets 25 times the spread
    w[0, :32], w[1, 32:64] = 0.0, 0.5
    ours = blocks.dequantize("q4_1", *blocks.quantize(w, "q4_1"))
    references = [_min_max_q4_1(w)]
    with contextlib.suppress(ImportError):
        import gguf

        kind = gguf.GGMLQuantizationType.Q4_1
        references.append(torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(w.numpy(), kind), kind)))
    ours_error = _blockwise_error(ours, w)
    for theirs in references:
        their_error = _blockwise_error(theirs, w)
        assert (ours_error <= their_error * (1 + 1e-6)).all()
        assert ours_error.sum() < 0.85 * their_error.sum()  # measured: 0.80 and 0.82 (10% less RMS error)
    assert torch.equal(ours[0, :32], w[0, :32]) and torch.equal(ours[1, 32:64], w[1, 32:64])


def test_q4_1_blocks_quantised_again_come_back_as_they_were() -> None:
    """A weight that already is Q4_1 (a GGUF file's blocks, dequantised) quantises to the same
    values: ``int4`` of a GGUF model computes what the file's own blocks compute."""
    gguf = pytest.importorskip("gguf")
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(2))
    kind = gguf.GGMLQuantizationType.Q4_1
    grids = torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(w.numpy(), kind), kind))
    assert torch.equal(blocks.dequantize("q4_1", *blocks.quantize(grids, "q4_1")), grids)


@pytest.mark.parametrize("fmt", kernels.FORMATS)
@pytest.mark.parametrize("m", [1, 8])
def test_the_reference_is_the_dequantised_product(fmt: str, m: int) -> None:
    x, (data, d, mins), _ = operands(fmt, m, 64, 100)
    levels = blocks.LEVELS[fmt]  # int16 activations for q8_0, int8 for the 4-bit formats
    xq, xd = kernels.quantize_activations(x, levels)
    assert int(xq.abs().max()) == levels and xq.dtype == (torch.int16 if fmt == "q8_0" else torch.int8)
    assert (xq.view(m, -1, 32).abs().amax(-1)[xd > 0] == levels).all()  # each block uses its range
    activations = (xq.float().view(m, -1, 32) * xd[..., None]).view(m, -1)
    assert (activations - x).abs().max() <= xd.max() / 2 + 1e-6  # within half a step
    expected = activations.double() @ blocks.dequantize(fmt, data, d, mins).double().T
    got = kernels.matmul_reference(x, fmt, data, d, mins).double()
    assert_close(got, expected, atol=1e-5 * expected.abs().max().item(), rtol=1e-5)


def test_a_kernel_that_cannot_run_is_named_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x, weight, _ = operands("q8_0", 1, 4, 32)
    with pytest.raises(ValueError, match="kernel='sse' is not a block kernel; use one of auto, avx2, neon, reference"):
        kernels.block_matmul(x, "q8_0", *weight, kernel="sse")
    other = "neon" if kernels.native() == "avx2" else "avx2"
    wrong = f"the {kernels.TITLES[other]} block kernel runs on {kernels.ARCHITECTURES[other]} CPUs, not this"
    with pytest.raises(kernels.KernelUnavailableError, match=wrong):
        kernels.block_matmul(x, "q8_0", *weight, kernel=other)
    with pytest.raises(ValueError, match="format='q5_k' is not a block format; use one of q8_0, q4_0, q4_1"):
        kernels.block_matmul(x, "q5_k", *weight)
    with pytest.raises(ValueError, match="need one k, a multiple of 32"):
        kernels.block_matmul(x[:, :31], "q8_0", *weight)
    with pytest.raises(ValueError, match="q4_1 takes its block minima m"):
        kernels.block_matmul(x, "q4_1", *kernels.quantize(torch.ones(4, 32), "q4_1")[:2])
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler")
    build.c_library.cache_clear()
    ops._auto.cache_clear()
    try:
        if not build.cpu_flags() >= kernels.FEATURES[kernels.native()]:
            pytest.skip("this CPU lacks a feature its kernel needs: that is the error, tested below")
        with pytest.raises(kernels.KernelUnavailableError, match="there is no C compiler \\('no-such-compiler'\\)"):
            kernels.block_matmul(x, "q8_0", *weight, kernel=kernels.native())
        reference = kernels.block_matmul(x, "q8_0", *weight, kernel="reference")
        assert_close(kernels.block_matmul(x, "q8_0", *weight), reference)  # auto falls back
    finally:
        build.c_library.cache_clear()
        ops._auto.cache_clear()
    if not kernels.FEATURES[kernels.native()]:
        return  # ARM64's kernel needs no flag: AArch64 always has NEON
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset({"sse2"}))
    needs = ", ".join(sorted(kernels.FEATURES[kernels.native()]))
    try:
        with pytest.raises(kernels.KernelUnavailableError, match=f"needs {needs}, which this CPU lacks"):
            kernels.block_matmul(x, "q8_0", *weight, kernel=kernels.native())
    finally:
        build.c_library.cache_clear()


@needs_c
@pytest.mark.parametrize("fmt", kernels.FORMATS)
@pytest.mark.parametrize("m", [1, 8, kernels.DENSE_ROWS + 3])
def test_the_ops_python_kernel_equals_its_cpp_kernel(fmt: str, m: int) -> None:
    """The op's two CPU kernels (C++ where it builds, :func:`ops._run_ctypes` where it does not)
    call the same C code: equal outputs, packed and unpacked weights side by side."""
    x, first, _ = operands(fmt, m, 37, 100, seed=1)
    second = operands(fmt, m, 129, 100, seed=2)[1]
    weights = [first, kernels.split(fmt, *second)]
    lists = ops._lists(weights)
    python = ops._run_ctypes(x, fmt, *lists)
    assert_close(torch.ops.attnkit.block_matmul(x, fmt, *lists), python, atol=0, rtol=0)
    expected = kernels.block_matmuls(x, fmt, weights, kernel="reference")
    assert_close(python, expected, atol=1e-5 * expected.abs().max().item(), rtol=1e-5)


FALLBACK = """
import logging, torch
logging.basicConfig(level=logging.INFO, format="%(message)s")
from attnkit import kernels
from attnkit.kernels import ops
x = torch.randn(3, 64)
weight = kernels.quantize(torch.randn(40, 64), "q4_0")
got = kernels.block_matmuls(x, "q4_0", [kernels.split("q4_0", *weight)])
torch.testing.assert_close(got, kernels.block_matmul(x, "q4_0", *weight, kernel="reference"))
print(ops._register())
"""


@needs_c
def test_without_a_cpp_compiler_the_op_runs_its_python_kernel(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "CXX": "no-such-compiler"}
    done = subprocess.run([sys.executable, "-c", FALLBACK], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["python"]
    assert "the block op's C++ kernel: there is no C++ compiler ('no-such-compiler')" in done.stderr


@needs_c
def test_the_cpp_kernel_refuses_what_the_c_code_cannot_take() -> None:
    x, weight, _ = operands("q8_0", 1, 8, 64)
    lists = ops._lists([weight])
    with pytest.raises(RuntimeError, match="format=q5_k is not a block format; use one of q8_0, q4_0, q4_1"):
        torch.ops.attnkit.block_matmul(x, "q5_k", *lists)
    with pytest.raises(RuntimeError, match="block_matmul takes x \\(m, k\\) in fp32"):
        torch.ops.attnkit.block_matmul(x.double(), "q8_0", *lists)
    with pytest.raises(RuntimeError, match="block_matmul takes 1 to 8 weights, not 9"):
        torch.ops.attnkit.block_matmul(x, "q8_0", *(t * 9 for t in lists))
