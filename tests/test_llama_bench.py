"""tools/llama_bench.sh, the build of llama.cpp's own llama-bench for the decoding benchmarks'
anchor: the commands it would run for a CPU with AMX (AMX off, every AVX-512 flag the CPU has
on), without (GGML_NATIVE) and for the forced AVX2 class (AVX2 kernels only), one cache entry
each; and where the binary is built here, the binary itself, decoding SmolLM2's GGUF file."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "tools" / "llama_bench.sh"
AMX = "avx2 fma f16c avx512f avx512_vnni avx512_bf16 amx_tile amx_int8 amx_bf16"


def dry_run(tmp_path: Path, flags: str | None = None, cpu_class: str = "") -> list[str]:
    """The script's commands and binary path, for a CPU of ``flags`` (this one's where None),
    acting as ``cpu_class`` (ATTNKIT_CPU_CLASS; its own where empty)."""
    cache = str(tmp_path / "cache")
    env = dict(os.environ, LLAMA_BENCH_DRY_RUN="1", LLAMA_BENCH_CACHE=cache, ATTNKIT_CPU_CLASS=cpu_class)
    if flags is not None:
        cpuinfo = tmp_path / f"cpuinfo-{len(flags)}"
        cpuinfo.write_text(f"model name\t: a CPU\nflags\t\t: {flags}\n")
        env["CPUINFO"] = str(cpuinfo)
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, check=True)
    return done.stdout.splitlines()


def test_amx_is_left_out_and_the_rest_of_the_cpu_kept(tmp_path: Path) -> None:
    download, configure, build, binary = dry_run(tmp_path, AMX)
    assert "--no-binary :all: llama-cpp-python==" in download
    options = configure.split()
    for off in ("-DGGML_NATIVE=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"):
        assert off in options
    for on in ("-DGGML_AVX2=ON", "-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON"):
        assert on in options
    assert "-DGGML_AVX_VNNI=ON" not in options and "-DBUILD_SHARED_LIBS=OFF" in options
    assert "--target llama-bench" in build
    assert binary.startswith(str(tmp_path / "cache")) and binary.endswith("/llama-bench")


def test_a_cpu_without_amx_builds_native_in_its_own_cache_entry(tmp_path: Path) -> None:
    _, configure, _, binary = dry_run(tmp_path, "avx2 fma f16c")
    assert "-DGGML_NATIVE=ON" in configure.split() and "AMX" not in configure
    assert binary != dry_run(tmp_path, AMX)[-1]


def test_the_forced_avx2_class_builds_avx2_kernels_only_in_its_own_cache_entry(tmp_path: Path) -> None:
    _, configure, _, binary = dry_run(tmp_path, AMX, cpu_class="avx2")
    options = configure.split()
    for flag in ("-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_AVX512=OFF", "-DGGML_AMX_INT8=OFF"):
        assert flag in options
    assert not [o for o in options if o.startswith("-DGGML_AVX512_") or o == "-DGGML_AVX_VNNI=ON"]
    assert binary != dry_run(tmp_path, AMX)[-1]


def test_the_built_binary_decodes_smollm2(tmp_path: Path, smollm2_gguf: Path) -> None:
    binary = Path(dry_run(tmp_path)[-1].replace(str(tmp_path / "cache"), str(cache())))
    if not binary.exists():
        pytest.skip(
            f"llama-bench is not built on this machine ({binary}): `make llama-bench` builds it, "
            "about 10 minutes on 2 cores, too long for the test run"
        )
    done = subprocess.run(
        [str(binary), "-m", str(smollm2_gguf), "-p", "0", "-n", "4", "-r", "1", "-t", "2", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    (row,) = json.loads(done.stdout)
    assert row["n_gen"] == 4 and row["avg_ts"] > 0


def cache() -> Path:
    return Path(os.environ.get("LLAMA_BENCH_CACHE", Path.home() / ".cache" / "attnkit" / "llama.cpp"))
