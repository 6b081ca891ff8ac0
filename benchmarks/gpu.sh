#!/usr/bin/env bash
# The GPU check of the performance issue, in one run of a few minutes: bf16 matmul peak, GPT-2
# 124M training steps against transformers (MFU against that peak), attention memory to n = 16k.
# Run from the repository root on a machine with a CUDA GPU; results land, dated, beside the CPU ones.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
OUT="benchmarks/results/gpu-$(date +%Y-%m-%d).json"
"$PYTHON" -m benchmarks gpu --repeats 10 --out "$OUT"
echo "wrote $OUT"
