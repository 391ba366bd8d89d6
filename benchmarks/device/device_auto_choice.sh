#!/usr/bin/env bash
# Device run (issue 53): `lucebox serve` on auto compares both engines by itself. One GPU lease
# (16 cores): `one` starts both builds by lucebox side by side (llama.cpp b11434 CUDA and the
# Lucebox engine 4cf58a04 without BSA), writes the generated qwen35 target with its agreeing
# Lucebox draft, and leaves one detached chain that waits for both builds and then runs
# benchmarks/engine_choice_on_auto.py (serve with nothing pinned, calibration on). `collect` waits
# until the chain is done or CALL_S runs out; `again` runs the measurement alone once more. The machine goes back 30 s after a call returns:
# send the next call at once. Carry .whl and .devrun/carry.
# Everything comes back as $OUT/auto-<phase>.tgz.
set -uo pipefail
export PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/.whl
start=$(date +%s)
END=$((start + ${CALL_S:-580}))
source benchmarks/device/device_env.sh
H=$LUCEBOX_HOME
M=$PWD/.devrun/work/models
C=$PWD/.devrun/auto
R=/tmp/auto-$1
rm -rf "$R"
mkdir -p "$R" "$C"

chain() {
    while [ ! -f "$H/build-llama.rc" ] || [ ! -f "$H/build-lucebox.rc" ]; do sleep 5; done
    [ "$(cat "$H/build-llama.rc")" = 0 ] || { echo "llama.cpp build failed"; return 1; }
    [ "$(cat "$H/build-lucebox.rc")" = 0 ] || { echo "Lucebox build failed"; return 1; }
    python3 -m lucebox.app.cli engine status --json > "$C/engine-status.json" 2>&1
    timeout 1100 python3 -m benchmarks.engine_choice_on_auto "$M/qwen35-tiny.gguf" \
        "$M/qwen35-tiny-dflash.gguf" "$C/auto-choice.json" --deadline-s 1000
}

case "$1" in
one)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$R/gpu.txt"
    rm -rf "${C:?}"/*
    BSA=0 bash benchmarks/device/device_session.sh start-llama > "$R/start.txt" 2>&1
    BSA=0 bash benchmarks/device/device_session.sh start-lucebox >> "$R/start.txt" 2>&1
    python3 benchmarks/lucebox_models.py "$M" pair > "$R/models.txt" 2>&1
    export -f chain
    export H M C
    setsid nohup bash -c "chain > $C/chain.log 2>&1; echo \$? > $C/chain.rc" \
        > /dev/null 2>&1 < /dev/null &
    ;;
again)  # the builds are in: the measurement alone, once more
    rm -rf "${C:?}"/*
    export -f chain
    export H M C
    setsid nohup bash -c "chain > $C/chain.log 2>&1; echo \$? > $C/chain.rc" \
        > /dev/null 2>&1 < /dev/null &
    ;;
collect) ;;
*)
    echo "usage: device_auto_choice.sh one|again|collect" >&2
    exit 2
    ;;
esac
while [ "$(date +%s)" -lt $((END - 15)) ] && [ ! -f "$C/chain.rc" ]; do sleep 3; done
for b in llama lucebox; do
    echo "build $b: rc $(cat "$H/build-$b.rc" 2>/dev/null || echo running) in $(cat "$H/build-$b.seconds" 2>/dev/null || echo '?') s"
done
echo "== chain: rc $(cat "$C/chain.rc" 2>/dev/null || echo running)"
tail -n 20 "$C/chain.log" 2>/dev/null
cp -r "$C" "$R/chain"
cp "$H"/build-*.json "$H"/build-*.seconds "$R/" 2>/dev/null
tail -c 3000 "$H/build-llama.log" > "$R/build-llama.tail" 2>/dev/null
tail -c 3000 "$H/build-lucebox.log" > "$R/build-lucebox.tail" 2>/dev/null
log=$(python3 -c "from lucebox.engine.core.paths import resolve_paths; from lucebox.engine.run.runstate import engine_log; print(engine_log(resolve_paths()))")
tail -c 200000 "$log" > "$R/engine.log" 2>/dev/null
tar -czf "$OUT/auto-$1.tgz" -C /tmp "auto-$1"
echo "call $1 done: $(($(date +%s) - start)) s"
