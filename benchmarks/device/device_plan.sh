#!/usr/bin/env bash
# Device run for the planner: CUDA engine (cached in .devrun/ while the machine stays warm),
# then benchmarks.plan_memory_vs_gpu for the models given as arguments (NAME:LEAVE_FREE_MIB). Writes $OUT.
set -uo pipefail
source benchmarks/device/device_env.sh
start=$(date +%s)
ensure_engine
echo "engine ready after $(( $(date +%s) - start )) s"
args=()
for model in "$@"; do args+=(--model "$model"); done
python3 -m benchmarks.plan_memory_vs_gpu --work .devrun/work "${args[@]}" | tee -a "$OUT/plan_vs_gpu.jsonl"
