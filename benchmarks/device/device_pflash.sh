#!/usr/bin/env bash
# Device run (issue 40): PFlash off vs --prefill pflash vs --prefill auto through `lucebox serve
# --engine lucebox` at prompts of about 8K, 32K, 64K and 128K tokens, the client's time to first
# token beside what `lucebox status --json` showed (benchmarks/long_prompt_modes_gpu.py). Assumes the repo
# root as cwd and LUCEBOX_HOME (benchmarks/device/device_env.sh) holding the Lucebox engine, built with
# Block-Sparse-Attention (`lucebox engine status --json` says which build has it: key bsa).
# SERVE_ARGS: more arguments for plan and serve (--gpu 0). Finishes within LIMIT_S (420 s); writes
# $OUT/pflash.json (and $OUT/results/<gpu>-pflash.json for benchmarks/results/) and
# $OUT/pflash-engine.log; leaves no process behind.
set -uo pipefail
started=$(date +%s)
source benchmarks/device/device_env.sh
M=$LUCEBOX_HOME/pflash-models
mkdir -p "$M" "$OUT/results"
cleanup() {
    lucebox down > /dev/null 2>&1
    [ -n "${driver:-}" ] && kill -- -"$driver" 2> /dev/null
    true
}
trap cleanup EXIT
lucebox engine status 2>&1 | grep -E "lucebox-|PFlash" | head -6
# The generated target and drafter, written once per warm machine.
python3 benchmarks/lucebox_models.py "$M" pflash || exit 1
echo "models after $(( $(date +%s) - started )) s"
# The driver stops itself before the deadline; timeout is the backstop.
deadline=$(( started + ${LIMIT_S:-420} - 25 ))
setsid timeout -k 5 $(( deadline + 15 - $(date +%s) )) \
    python3 benchmarks/long_prompt_modes_gpu.py "$M" "$OUT/pflash.json" --deadline "$deadline" \
    --serve-args "${SERVE_ARGS:-}" &
driver=$!
wait $driver
rc=$?
driver=
echo "driver exit $rc after $(( $(date +%s) - started )) s"
cp "$LUCEBOX_HOME/logs/engine.log" "$OUT/pflash-engine.log" 2> /dev/null
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-' | tr -cd 'a-z0-9-')
[ -f "$OUT/pflash.json" ] && cp "$OUT/pflash.json" "$OUT/results/${gpu:-gpu}-pflash.json"
ls -la "$OUT" "$OUT/results"
exit $rc
