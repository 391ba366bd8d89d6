#!/usr/bin/env bash
# Device run for issue 39 (the engine chosen by measurement): both engines, already built by
# lucebox in LUCEBOX_HOME, serve a generated qwen35 target with an agreeing Lucebox draft and
# with one that never agrees; each runs the calibration's probes plus an agent turn and a
# decode-heavy reply, and the engines' verdict is taken under an agent-like and a decode-heavy
# mix (benchmarks/engine_choice_measured.py). Run from the repo root: bash benchmarks/device/device_engine_choice.sh
# Writes $OUT/engine_choice.json (and benchmarks/results/device-engine-choice.json) and prints a
# summary; stops every server it started.
set -uo pipefail
source benchmarks/device/device_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
lucebox engine status --json > "$OUT/engine-status.json" 2>&1
timeout --kill-after=5 225 python3 -m benchmarks.engine_choice_measured "$OUT/engine_choice.json"
rc=$?
# A driver stopped by the timeout leaves its serve behind: stop it through its own home.
LUCEBOX_HOME=/tmp/lucebox-engine-choice/home python3 -m lucebox.app.cli down > /dev/null 2>&1
mkdir -p benchmarks/results
cp "$OUT/engine_choice.json" benchmarks/results/device-engine-choice.json 2> /dev/null
echo "rc=$rc"
exit $rc
