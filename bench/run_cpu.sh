#!/usr/bin/env bash
# Every CPU table of the README's Performance section in one run: bench_beacon (beacon vs full
# attention), bench_focus (FocusLLM condensing / decoding), bench_compile_cache (cold vs warm
# process), bench_beacon_train (train.py step vs prefill on SmolLM2, fetched on first use).
# Results: bench/results/{beacon,focus,compile_cache,beacon_train}.{json,md}, each stamped with
# the date, machine, load and git commit. ~35 min on 2 quiet cores.
# Usage: nohup bash bench/run_cpu.sh > bench/results/run_cpu.log 2>&1 &
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"  # the venv's python: PYTHON=.venv/bin/python when it is not activated
export JAX_PLATFORMS=cpu HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p bench/results
echo "start: $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null) $(uptime)"
"$PY" -m bench.bench_beacon "$@"
echo "beacon done: $(date -u +%FT%TZ) $(uptime)"
"$PY" -m bench.bench_focus
echo "focus done: $(date -u +%FT%TZ) $(uptime)"
"$PY" -m bench.bench_compile_cache
echo "compile cache done: $(date -u +%FT%TZ) $(uptime)"
"$PY" -m bench.bench_beacon_train --modes task,task-noremat --runs 2
echo "end: $(date -u +%FT%TZ) $(uptime)"
