#!/usr/bin/env bash
# One prepared GPU check for the attention kernels (issue 7): correctness of the compiled Pallas
# kernels on the GPU, Pallas-vs-XLA timings (beacon window, chunk condensing, decode; D=128, 28/4
# heads, 32K-128K contexts), then the CPU-interpret kernel tests under this machine's jax.
# Writes $OUT/gpu_check.md, $OUT/gpu_check.json and $OUT/gpu_check.log. Stays under 8 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT"
export OUT
PY="${PYTHON:-python}"
# Leave XLA's default preallocation alone but let two processes (this + pytest) coexist.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.85}"
timeout 470 "$PY" hardware/gpu_check.py --budget "${GPU_CHECK_BUDGET:-400}" "$@" 2>&1 | tee "$OUT/gpu_check.log"
exit "${PIPESTATUS[0]}"
