#!/usr/bin/env bash
# The Lucebox engine's update on the GPU machine (issue 42), in one call of at most 420 s:
# 62880e20 built with `lucebox engine build --engine lucebox` beside the installed 4cf58a04 and
# made the current build, `lucebox engine update --engine lucebox` to 4cf58a04 (the installed
# build, not built again) self-tested with the generated qwen35 target + Lucebox draft, then
# `lucebox engine rollback`; the new build's plan against nvidia-smi after warm-up (within 5%).
# Needs: LUCEBOX_HOME with 4cf58a04 built (benchmarks/device/device_env.sh), LUCEBOX_TARBALL_62880E20.
# Writes $OUT/engine_update.json (and the copy for benchmarks/results/ under $OUT/results/).
set -uo pipefail
source benchmarks/device/device_env.sh
: "${OUT:?OUT must name the output folder}"
: "${LUCEBOX_TARBALL_62880E20:?the 62880e20 tarball path}"
export MODELS_DIR=${MODELS_DIR:-$PWD/.devrun/work/lucebox-update}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-' | cut -d- -f2)
export PIDS_FILE=$OUT/work/pids
mkdir -p "$OUT/work" && : > "$PIDS_FILE"
# BUDGET_S / BUILD_DEADLINE_S (390 / 310) may be raised for a longer lease.
export BUDGET_S=${BUDGET_S:-390} BUILD_DEADLINE_S=${BUILD_DEADLINE_S:-310}
timeout -k 5 $(( ${BUDGET_S%.*} + 10 )) python3 -m benchmarks.engine_update_gpu "$OUT"
rc=$?
# Whatever the driver started (each child in its own session) ends with it, killed or not.
lucebox down > /dev/null 2>&1
while read -r pid; do kill -KILL -- "-$pid" 2> /dev/null; done < "$PIDS_FILE"
mkdir -p "$OUT/results"
[ -f "$OUT/engine_update.json" ] \
    && cp "$OUT/engine_update.json" "$OUT/results/${gpu:-gpu}-lucebox-engine-update.json"
tail -n 3 "$OUT/work/build.err" 2>/dev/null
echo "device_engine_update rc=$rc"
exit $rc
