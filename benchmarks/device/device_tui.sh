#!/usr/bin/env bash
# Device run for the dashboard's cost on the GPU: the CUDA engine, a generated model (support/ggufgen
# SHAPES name, default llama8b) and benchmarks.tui_overhead against it (`lucebox up` in a
# pseudo-terminal vs `lucebox serve`). Needs textual and its dependencies in .whl/ as well.
set -uo pipefail
source benchmarks/device/device_env.sh
ensure_engine
model=$(generated_model "${1:-llama8b}")
python3 -m benchmarks.tui_overhead --model "$model" --window-s "${WINDOW_S:-30}" --rounds "${ROUNDS:-2}" \
    | tee "$OUT/tui_overhead.json"
