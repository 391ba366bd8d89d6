#!/usr/bin/env bash
# Device run for the one planner: the CUDA engine lucebox builds by itself, then what
# `lucebox serve` launches against its plan with 16 GiB free (a target + draft pair, n-gram,
# none). Run from the repo root with the wheels and the pinned sdist in .whl/. Writes to $OUT.
set -uo pipefail
source benchmarks/device/device_env.sh
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee "$OUT/gpu.txt"
start=$(date +%s)
ensure_engine
echo "engine ready after $(( $(date +%s) - start )) s" | tee "$OUT/engine.txt"
lucebox engine status --json > "$OUT/engine-status.json"
python3 -m benchmarks.launch_matches_plan_gpu --work .devrun/work "$@" | tee "$OUT/launch_vs_gpu.jsonl"
cp .devrun/work/*.serve.log "$OUT/" 2>/dev/null
cp .devrun/home/state/logs/engine.log "$OUT/engine.log" 2>/dev/null
exit 0
