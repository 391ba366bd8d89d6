#!/usr/bin/env bash
# One GPU lease's engines, built once and carried to the next lease (a lease lasts 30 minutes;
# both builds take most of a call). Run from the repo root with .whl and .devrun/carry carried
# (the wheels; the Lucebox source tarballs and Block-Sparse-Attention's from ../shared/engines).
#   build     llama.cpp's CUDA build and the Lucebox engine 4cf58a04 with Block-Sparse-Attention
#             (PFlash's fast kernel; BSA=0 leaves it out) side by side, each in its own session so a call that ends
#             first does not stop them; waited for up to WAIT_S; then both engine folders packed
#             into $OUT as engines.tar.xz.partN (carry them back in .devrun/carry; PACK=0: not).
#   start     start the builds (and write the generated Lucebox models) and return at once.
#   start-lucebox  start the Lucebox engine's build only (another LUCEBOX_HOME: a BSA build
#             beside one without it) and return at once; start-llama: llama.cpp's only.
#   wait      wait for the builds a previous call started, then pack as above.
#   restore   a later lease: unpack the carried engines into LUCEBOX_HOME (no build).
# LUCEBOX_HOME is .devrun/home unless named (benchmarks/device/device_env.sh), so every benchmarks/device_*.sh finds
# them.
set -uo pipefail
# No network there: the web UI's node wheel must fail at once, not after pip's retries (that
# stalled llama.cpp's build for minutes at 10%).
export PIP_NO_INDEX=1
source benchmarks/device/device_env.sh
C=$PWD/.devrun/carry
H=$LUCEBOX_HOME
WAIT_S=${WAIT_S:-560}
mkdir -p "$H"

start_llama() {
    rm -f "$H"/build-llama.rc
    setsid nohup bash -c "
        s=\$(date +%s)
        python3 -m lucebox.app.cli engine source --sdist $ENGINE_SDIST > $H/build-llama.log 2>&1 &&
        python3 -m lucebox.app.cli engine build --json > $H/build-llama.json 2>> $H/build-llama.log
        rc=\$?; echo \$(( \$(date +%s) - s )) > $H/build-llama.seconds; echo \$rc > $H/build-llama.rc
    " > /dev/null 2>&1 < /dev/null &
}

start_lucebox() {
    # Block-Sparse-Attention's one kernel compiles for ~14 minutes on one core: BSA=0 leaves it
    # out when the lease has no time for it (PFlash then runs its slow fallback).
    local bsa=""
    [ "${BSA:-1}" = 1 ] && bsa="--bsa-tarball $C/block-sparse-attention-49d6c39e-cutlass-a75b4ac4.tar.gz"
    rm -f "$H"/build-lucebox.rc
    setsid nohup bash -c "
        s=\$(date +%s)
        python3 -m lucebox.app.cli engine source --engine lucebox --version 4cf58a04 \
            --tarball $C/lucebox-4cf58a04-server.tar.gz $bsa > $H/build-lucebox.log 2>&1 &&
        python3 -m lucebox.app.cli engine build --engine lucebox --version 4cf58a04 --json \
            > $H/build-lucebox.json 2>> $H/build-lucebox.log
        rc=\$?; echo \$(( \$(date +%s) - s )) > $H/build-lucebox.seconds; echo \$rc > $H/build-lucebox.rc
    " > /dev/null 2>&1 < /dev/null &
}

start_builds() {
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv
    start_llama
    start_lucebox
}

wait_builds() {
    for _ in $(seq 1 "$WAIT_S"); do
        [ -f "$H/build-llama.rc" ] && [ -f "$H/build-lucebox.rc" ] && return 0
        sleep 1
    done
    return 1
}

report_and_pack() {
    for b in llama lucebox; do
        echo "== $b: rc $(cat "$H/build-$b.rc" 2>/dev/null || echo running) in $(cat "$H/build-$b.seconds" 2>/dev/null || echo '?') s"
        tail -c 1500 "$H/build-$b.log" 2>/dev/null
        python3 -c "import json,sys; d=json.load(open('$H/build-$b.json')); print(d['id'], d.get('options'), d.get('elapsed_s'))" 2>/dev/null
    done
    tar -czf "$OUT/build-logs.tgz" -C "$H" $(cd "$H" && ls build-* 2>/dev/null) 2>/dev/null
    if [ "${PACK:-1}" = 1 ] && [ "$(cat "$H/build-llama.rc" 2>/dev/null)" = 0 ] && [ "$(cat "$H/build-lucebox.rc" 2>/dev/null)" = 0 ]; then
        (cd "$H/data/engines" && tar -cf - */ | xz -T0 -6 | split -b 15M -d -a 1 - "$OUT/engines.tar.xz.part")
        ls -la "$OUT"
    fi
}

case "${1:-}" in
start)
    start_builds
    python3 benchmarks/lucebox_models.py .devrun/work/models all > /dev/null 2>&1
    ;;
build)
    start_builds
    python3 benchmarks/lucebox_models.py .devrun/work/models all > /dev/null 2>&1 &
    wait_builds || echo "builds still running after $WAIT_S s"
    report_and_pack
    ;;
start-lucebox)
    start_lucebox
    ;;
start-llama)
    start_llama
    ;;
wait)
    wait_builds || echo "builds still running after $WAIT_S s"
    report_and_pack
    ;;
restore)
    mkdir -p "$H/data/engines"
    cat "$C"/engines.tar.xz.part* | xz -d | tar -x -C "$H/data/engines" || exit 1
    ls "$H/data/engines"
    python3 -m lucebox.app.cli engine status 2>&1 | tail -8
    ;;
*)
    echo "usage: device_session.sh start|start-lucebox|start-llama|build|wait|restore" >&2
    exit 2
    ;;
esac
