#!/usr/bin/env bash
# Device run for RPC peers: the GPU plus a loopback `lucebox worker` on the same GPU are two
# devices; a generated model split across them is planned and served, and each process's memory
# (nvidia-smi: llama-server, ggml-rpc-server) is compared with its share of the plan (5%).
# Run from the repo root with the wheels and the pinned sdist in .whl/. Writes to $OUT.
set -uo pipefail
source benchmarks/device/device_env.sh
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee "$OUT/gpu.txt"
start=$(date +%s)
ensure_engine
echo "engine ready after $(( $(date +%s) - start )) s" | tee "$OUT/engine.txt"
lucebox engine status --json > "$OUT/engine-status.json"
python3 -m benchmarks.rpc_peer_vs_gpu --work .devrun/work "$@" | tee "$OUT/rpc_vs_gpu.jsonl"
cp .devrun/work/rpc.serve.log .devrun/work/worker.out "$OUT/" 2>/dev/null
cp .devrun/home/state/logs/worker-50052.log "$OUT/worker.log" 2>/dev/null
cp .devrun/home/state/logs/engine.log "$OUT/engine.log" 2>/dev/null
exit 0
