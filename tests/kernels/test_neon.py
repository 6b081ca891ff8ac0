"""The ARM64 block kernel (``blocks.c`` with ``blocks_neon.h``) on an x86-64 machine: cross-compiled
with ``aarch64-linux-gnu-gcc`` into a program (``harness.c``) and run under ``qemu-aarch64``, built
with the dot-product instructions (``sdot``) and without them (plain ARMv8), each equal to the
PyTorch reference for every format on odd shapes at batch 1 and 8, packed and unpacked weights in
one call, and its dequantisation equal to :func:`attnkit.kernels.blocks.dequantize`; and attnkit's
own build of it, as on an ARM64 machine, an ARM64 library with sdot. On an ARM64 machine the kernel
runs natively in test_blocks.py instead. Emulated: correct, not timed."""

from __future__ import annotations

import platform
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import torch
from test_blocks import operands  # tests/kernels is on the path (pytest prepends it)
from torch import Tensor
from torch.testing import assert_close

from attnkit import kernels
from attnkit.kernels import blocks, build

CC, QEMU, OBJDUMP = "aarch64-linux-gnu-gcc", "qemu-aarch64", "aarch64-linux-gnu-objdump"
pytestmark = [
    pytest.mark.skipif(
        platform.machine().lower() in ("aarch64", "arm64"), reason="on ARM64 the NEON kernel runs in test_blocks.py"
    ),
    pytest.mark.skipif(
        not (shutil.which(CC) and shutil.which(QEMU)),
        reason=f"no {CC} or {QEMU} (Debian: apt-get install gcc-aarch64-linux-gnu qemu-user; make setup does, as root)",
    ),
]
BUILDS = {"dotprod": "-march=armv8.2-a+dotprod", "armv8": "-march=armv8-a"}  # kernels.isa_flags's two


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The harness built each way, once: {build: program}."""
    folder = tmp_path_factory.mktemp("neon")
    programs = {}
    for name, march in BUILDS.items():
        program = folder / f"harness-{name}"
        source = Path(__file__).with_name("harness.c")
        command = [CC, "-O3", march, *kernels.FLAGS[:2], "-static", "-std=c11", str(source), str(kernels.SOURCE)]
        subprocess.run([*command, "-o", str(program)], check=True, capture_output=True, text=True)
        programs[name] = program
    return programs


def run(program: Path, mode: int, fmt: str, k: int, weights: list[tuple], x: Tensor | None = None) -> Tensor:
    """The harness's output for ``weights`` (each ``(data, d, m, packed)``, any of the last three
    None) and, mode 0, activations ``x`` (m, k): the flat fp32 values it wrote."""
    header = struct.pack("<5q", mode, kernels.FORMATS.index(fmt), 0 if x is None else len(x), k, len(weights))
    parts = [[b"" if t is None else t.contiguous().numpy().tobytes() for t in weight] for weight in weights]
    sizes = b"".join(
        struct.pack("<5q", kernels.rows(fmt, w[0], w[3], k), *(len(p) for p in part))
        for w, part in zip(weights, parts, strict=True)
    )
    activations = b"" if x is None else x.contiguous().numpy().tobytes()
    payload = header + sizes + activations + b"".join(b"".join(p) for p in parts)
    done = subprocess.run([QEMU, str(program)], input=payload, capture_output=True, timeout=120)
    assert done.returncode == 0, f"the harness exited with status {done.returncode}: {done.stderr.decode()[-300:]}"
    return torch.frombuffer(bytearray(done.stdout), dtype=torch.float32)


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("fmt", kernels.FORMATS)
@pytest.mark.parametrize("m", [1, 8])
@pytest.mark.parametrize(("n", "k"), [(37, 50), (5, 32), (129, 100)])
def test_the_neon_kernel_equals_the_reference(harness: dict, build: str, fmt: str, m: int, n: int, k: int) -> None:
    """A packed weight (its groups of 8 rows and the rest) beside one held as plain blocks."""
    x, weight, _ = operands(fmt, m, n, k)
    other = operands(fmt, m, 13, k, seed=4)[1]
    expected = torch.cat([kernels.matmul_reference(x, fmt, *w) for w in (weight, other)], dim=-1)
    split = kernels.split(fmt, *weight)
    got = run(harness[build], 0, fmt, x.shape[1], [split, (*other, None)], x).view(m, -1)
    assert_close(got, expected, atol=1e-5 * expected.abs().max().item(), rtol=1e-5)


@pytest.mark.parametrize("fmt", kernels.FORMATS)
def test_the_neon_kernel_dequantises_as_the_reference(harness: dict, fmt: str) -> None:
    _, weight, _ = operands(fmt, 1, 19, 100)
    got = run(harness["armv8"], 1, fmt, 128, [(*weight, None)]).view(19, 128)
    assert_close(got, blocks.dequantize(fmt, *weight), atol=0, rtol=0)


def test_the_dotprod_build_uses_sdot(harness: dict) -> None:
    """The flags kernels.isa_flags gives a CPU with ``asimddp`` make the compiler emit sdot; plain
    ARMv8's make it emit none (the smull fallback)."""
    assert kernels.isa_flags("neon", frozenset({"asimd", "asimddp"})) == (BUILDS["dotprod"],)
    assert kernels.isa_flags("neon", frozenset({"asimd"})) == (BUILDS["armv8"],)
    if not shutil.which(OBJDUMP):
        pytest.skip(f"no {OBJDUMP} to read the programs' instructions")
    counts = {}
    for name, program in harness.items():
        listing = subprocess.run([OBJDUMP, "-d", str(program)], capture_output=True, text=True, check=True).stdout
        counts[name] = sum("\tsdot\t" in line for line in listing.splitlines())
    assert counts["dotprod"] > 0 and counts["armv8"] == 0, counts


@pytest.mark.parametrize("flags", [{"fp", "asimd", "asimddp"}, set()])
def test_on_arm64_the_kernel_builds_for_the_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: set) -> None:
    """What attnkit does at first use on an ARM64 machine (the machine and its flags faked, the
    cross compiler as ``CC``): blocks.c with blocks_neon.h compiles into an ARM64 library, with sdot
    where the CPU lists ``asimddp`` and without where it lists nothing (a Mac has no
    /proc/cpuinfo), which this machine then cannot load: the one-line error says so."""
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setenv("CC", CC)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    build.c_library.cache_clear()
    try:
        assert kernels.native() == "neon"
        built = build.c_library()
    finally:
        build.c_library.cache_clear()
    assert isinstance(built, kernels.KernelUnavailableError)
    assert str(built).startswith("the NEON block kernel cannot be loaded from"), built
    (library,) = (tmp_path / "attnkit" / "kernels").glob("blocks-neon-*.so")
    assert int.from_bytes(library.read_bytes()[18:20], "little") == 183  # the ELF header's machine: AArch64
    if shutil.which(OBJDUMP):
        listing = subprocess.run([OBJDUMP, "-d", str(library)], capture_output=True, text=True, check=True).stdout
        assert ("\tsdot\t" in listing) == ("asimddp" in flags)
