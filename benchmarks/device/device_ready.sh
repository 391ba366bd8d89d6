#!/usr/bin/env bash
# Device run for serve's ready time on the GPU: the CUDA engine (build cached in .devrun/ while
# the machine stays warm), a generated model (support/ggufgen SHAPES name, default llama8b), and
# benchmarks.serve_overhead against it. Writes $OUT/serve_overhead.json.
set -uo pipefail
source benchmarks/device/device_env.sh
ensure_engine
model=$(generated_model "${1:-llama8b}")
python3 -m benchmarks.serve_overhead --model "$model" --idle-s 30 --requests 3 \
    | tee "$OUT/serve_overhead.json"
