#!/usr/bin/env bash
# The full CPU benchmark run (issue 8): bench_beacon then bench_focus, in the background-safe way
# (nohup-friendly), results in bench/results/{beacon,focus}.{json,md} + run_cpu.log. ~25 min on
# 2 shared cores. Usage: nohup bash bench/run_cpu.sh > bench/results/run_cpu.log 2>&1 &
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
export JAX_PLATFORMS=cpu HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p bench/results
echo "start: $(date -u +%FT%TZ) $(uptime)"
"$PY" -m bench.bench_beacon "$@"
echo "beacon done: $(date -u +%FT%TZ) $(uptime)"
"$PY" -m bench.bench_focus
echo "end: $(date -u +%FT%TZ) $(uptime)"
