#!/usr/bin/env bash
# llama.cpp's own C++ benchmark, llama-bench, built from the llama.cpp source that the
# llama-cpp-python sdist vendors (the version the decoding benchmark's Python row runs), for the
# anchor rows of `python -m benchmarks smollm2` and `decoding`. Prints the binary's path.
#
#   tools/llama_bench.sh            build once (about 10 minutes on 2 cores), else the cached path
#   LLAMA_BENCH_DRY_RUN=1 tools/llama_bench.sh   print the cmake commands, build nothing
#
# The build is GGML_NATIVE (the CPU's own flags) but on a CPU with AMX, where ggml's AMX code
# crashed at the first product on a 2-core Intel Xeon (2026-12-03): there every AVX-512 flag the
# CPU has, AMX off. With ATTNKIT_CPU_CLASS=avx2 (the benchmarks' forced AVX2 class) it builds
# llama.cpp's AVX2 kernels only (AVX2, FMA, F16C; no AVX-512, no AMX), the build an AVX2-only
# CPU's user runs, so that both sides of a forced-AVX2 row use AVX2 kernels. Static, so the
# binary needs no library beside it. Cached under
# ${LLAMA_BENCH_CACHE:-~/.cache/attnkit/llama.cpp}/<version>-<flags' hash>/llama-bench.
# Environment: PYTHON (default .venv/bin/python, for pip), LLAMA_CPP_PYTHON_VERSION, CPUINFO (a
# file read instead of /proc/cpuinfo, for the tests).
set -euo pipefail

version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
python=${PYTHON:-.venv/bin/python}
cpuinfo=${CPUINFO:-/proc/cpuinfo}
flags=$(grep -m1 -E '^(flags|Features)' "$cpuinfo" | cut -d: -f2 || true)
has() { [[ " $flags " == *" $1 "* ]]; }

options=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF
         -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF)
if [[ ${ATTNKIT_CPU_CLASS:-} == avx2 ]]; then
    options+=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF
              -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
elif has amx_int8 || has amx_bf16 || has amx_tile; then
    options+=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
              -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
    has avx512f && options+=(-DGGML_AVX512=ON)
    has avx512_vbmi && options+=(-DGGML_AVX512_VBMI=ON)
    has avx512_vnni && options+=(-DGGML_AVX512_VNNI=ON)
    has avx512_bf16 && options+=(-DGGML_AVX512_BF16=ON)
    has avx_vnni && options+=(-DGGML_AVX_VNNI=ON)
else
    options+=(-DGGML_NATIVE=ON)
fi

key=$(printf '%s\n' "$version" "${options[@]}" "$(grep -m1 '^model name' "$cpuinfo" || true)" | sha256sum | cut -c1-12)
out=${LLAMA_BENCH_CACHE:-$HOME/.cache/attnkit/llama.cpp}/$version-$key
work=${LLAMA_BENCH_WORK:-${TMPDIR:-/tmp}/llama-bench-build.$$}
source_dir=$work/llama_cpp_python-$version/vendor/llama.cpp

if [[ -n ${LLAMA_BENCH_DRY_RUN:-} ]]; then
    echo "$python -m pip download --no-deps --no-binary :all: llama-cpp-python==$version -d $work"
    echo "cmake -S $source_dir -B $work/build ${options[*]}"
    echo "cmake --build $work/build --target llama-bench -j $(nproc)"
    echo "$out/llama-bench"
    exit 0
fi
if [[ -x $out/llama-bench ]]; then
    echo "$out/llama-bench"
    exit 0
fi
[[ -z ${LLAMA_BENCH_WORK:-} ]] && trap 'rm -rf "$work"' EXIT
mkdir -p "$work"
command -v cmake >/dev/null || { echo "llama_bench.sh: cmake is not installed; apt-get install cmake" >&2; exit 1; }
echo "building llama-bench from llama-cpp-python $version's llama.cpp (about 10 minutes on 2 cores)" >&2
"$python" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work" >&2
tar xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work"
cmake -S "$source_dir" -B "$work/build" "${options[@]}" >&2
cmake --build "$work/build" --target llama-bench -j "$(nproc)" >&2
mkdir -p "$out"
install -m 755 "$work/build/bin/llama-bench" "$out/llama-bench.part"
mv "$out/llama-bench.part" "$out/llama-bench"  # atomic: a half-copied binary is never the cached one
echo "$out/llama-bench"
