#!/usr/bin/env bash
# GPU benchmark (issue 8) for one lent H200: Qwen2-7B-shaped random bf16 weights, Activation
# Beacon prefill at 32K and 128K (ratio 8) + decode tokens/s, FocusLLM condensing at 32K, MFU
# against a bf16 matmul measured on the spot. Writes $OUT/bench_gpu.md, $OUT/bench_gpu.json and
# $OUT/bench_gpu.log. Stays under 8 minutes (deadline 400 s inside, hard timeout 470 s).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/bench/results}"
mkdir -p "$OUT"
export OUT
PY="${PYTHON:-python}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.90}"
timeout 470 "$PY" -m bench.bench_gpu --budget "${BENCH_GPU_BUDGET:-400}" "$@" 2>&1 | tee "$OUT/bench_gpu.log"
exit "${PIPESTATUS[0]}"
