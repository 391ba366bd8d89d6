#!/usr/bin/env bash
# A two-GPU lease's plan (nvidia-h200-x2: 32 cores, two cards). `one` starts the builds and one
# detached chain of runs per card; the calls after it only wait and collect, so the work goes on
# between calls. Carry .whl and .devrun/carry (the Lucebox and Block-Sparse-Attention tarballs).
# The machine goes back 30 s after a call returns: send the next call at once.
#   one      builds side by side: the Lucebox engine 4cf58a04 without BSA in .devrun/home and
#            with BSA in .devrun/home-bsa (LLAMA_BUILD=1 adds llama.cpp's CUDA build); the
#            generated models; then, detached:
#              card 0: once the build without BSA is in, the exact cache vs KVFlash on a card
#                      held so that only q4_0 fits exactly (issue 39; CARD0=kvcal: the
#                      long-context mode measurement of `lucebox serve` itself instead;
#                      CARD0=none: nothing);
#              card 1: the fault bench (issue 37; FAULTS_ONLY names entries, none: no fault
#                      bench; SIGILL=1 adds the SIGILL entry, which starts a CUDA rebuild),
#                      then PFlash's models and, once the BSA build is in, PFlash off vs
#                      pflash vs auto (issue 40; BSA_BUILD=0: neither).
#            With CARD0=none and FAULTS_ONLY=none nothing needs the build without BSA: it and
#            its models are left out, and the BSA build has the cores to itself.
#            The BSA build runs from a copy of the tree in /tmp/bsa-tree: an engine's source is
#            unpacked in the checkout's deps/, which two builds side by side must not share.
#   collect  waits until both chains are done or CALL_S (580 s) runs out.
# Everything measured so far comes back as $OUT/lease-<phase>.tgz.
set -uo pipefail
export PIP_NO_INDEX=1
start=$(date +%s)
END=$((start + ${CALL_S:-580}))
source benchmarks/device/device_env.sh
A=$LUCEBOX_HOME
B=$PWD/.devrun/home-bsa
F=$PWD/.devrun/home-faults
M=$PWD/.devrun/work/models
C=$PWD/.devrun/chain
R=/tmp/lease-$1
rm -rf "$R"
mkdir -p "$R" "$C"
elapsed() { echo "$(($(date +%s) - start)) s"; }

# Waits for a build's rc file; fails unless the build succeeded.
built() {
    while [ ! -f "$1/build-lucebox.rc" ]; do sleep 5; done
    [ "$(cat "$1/build-lucebox.rc")" = 0 ]
}

faults_home() {
    # The fault bench's own home: a copy of the Lucebox build (its manifest names the copy) and
    # of the models, so its truncation and binary removal touch nothing the other runs use.
    local id
    id=$(python3 -c "import json; print(json.load(open('$A/build-lucebox.json'))['id'])") || return 1
    mkdir -p "$F/data/engines" "$F/models"
    cp -a "$A/data/engines/$id" "$F/data/engines/"
    sed -i "s#$A/#$F/#g" "$F/data/engines/$id/manifest.json"
    cp "$M/qwen35-tiny.gguf" "$M/qwen35-tiny-dflash.gguf" "$F/models/"
}

chain_card0() {
    [ "${CARD0:-kv}" = none ] && return 0
    built "$A" || { echo "no Lucebox build"; return 1; }
    if [ "${CARD0:-kv}" = kvcal ]; then
        mkdir -p "$C/kvcal"
        CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0 FROM_HOME=$A MODELS=$M \
            SERVE_ARGS="--gpu 0" LIMIT_S=420 OUT=$C/kvcal timeout 480 bash benchmarks/device/device_kv_calibration.sh
        return
    fi
    mkdir -p "$C/kv"
    CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0 timeout 900 python3 benchmarks/long_prompt_modes_gpu.py \
        "$M" "$C/kv/kv.json" --set kv --port 18240 --serve-args "--gpu 0" \
        --deadline $(($(date +%s) + 840))
}

chain_card1() {
    if [ "${FAULTS_ONLY:-}" != none ]; then
        built "$A" && faults_home || { echo "no Lucebox build"; return 1; }
        local entries=${FAULTS_ONLY:-kill-9,sigstop,gpu-oom,truncated,port-taken,full-disk,binary-removed}
        [ "${SIGILL:-0}" = 1 ] && entries="$entries,sigill"
        CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1 LUCEBOX_HOME=$F python3 -m benchmarks.engine_faults \
            --engine lucebox --model "$F/models/qwen35-tiny.gguf" --draft "$F/models/qwen35-tiny-dflash.gguf" \
            --work "$F/work" --serve-args "--gpu 1" --only "$entries" --out "$C/faults.json"
        echo "faults rc $?"
    fi
    [ "${BSA_BUILD:-1}" = 1 ] || return 0
    # PFlash's models are written while the BSA build runs, not after it.
    python3 benchmarks/lucebox_models.py "$B/pflash-models" pflash || return 1
    built "$B" || { echo "the BSA build failed"; return 1; }
    mkdir -p "$C/pflash"
    CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1 LUCEBOX_HOME=$B SERVE_ARGS="--gpu 1" \
        LIMIT_S=600 OUT=$C/pflash bash benchmarks/device/device_pflash.sh
}

case "$1" in
one)
    nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total --format=csv | tee "$R/gpu.txt"
    rm -rf "${C:?}"/*
    [ "${LLAMA_BUILD:-0}" = 1 ] && bash benchmarks/device/device_session.sh start-llama > "$R/start.txt" 2>&1
    # The build without BSA and its models only for the runs that use them.
    if [ "${CARD0:-kv}" != none ] || [ "${FAULTS_ONLY:-}" != none ]; then
        BSA=0 bash benchmarks/device/device_session.sh start-lucebox >> "$R/start.txt" 2>&1
        python3 benchmarks/lucebox_models.py "$M" all > "$R/models.txt" 2>&1
    fi
    if [ "${BSA_BUILD:-1}" = 1 ]; then
        T=/tmp/bsa-tree
        rm -rf "$T" && mkdir -p "$T/.devrun" && cp -a engine app presets bench tests pyproject.toml .whl "$T/"
        ln -s "$PWD/.devrun/carry" "$T/.devrun/carry"
        (cd "$T" && LUCEBOX_HOME=$B BSA=1 bash benchmarks/device/device_session.sh start-lucebox) >> "$R/start.txt" 2>&1
    fi
    echo "builds started: $(elapsed)"
    export -f built faults_home chain_card0 chain_card1
    export A B F M C CARD0 BSA_BUILD FAULTS_ONLY SIGILL
    for card in 0 1; do
        setsid nohup bash -c "chain_card$card > $C/card$card.log 2>&1; echo \$? > $C/card$card.rc" \
            > /dev/null 2>&1 < /dev/null &
    done
    ;;
collect) ;;
*)
    echo "usage: device_lease.sh one|collect" >&2
    exit 2
    ;;
esac
while [ "$(date +%s)" -lt $((END - 15)) ]; do
    [ -f "$C/card0.rc" ] && [ -f "$C/card1.rc" ] && break
    sleep 3
done
for home in "$A" "$B"; do
    echo "build in $home: rc $(cat "$home/build-lucebox.rc" 2>/dev/null || echo running) in $(cat "$home/build-lucebox.seconds" 2>/dev/null || echo '?') s"
done
for card in 0 1; do
    echo "== card $card: rc $(cat "$C/card$card.rc" 2>/dev/null || echo running)"
    tail -n 16 "$C/card$card.log" 2>/dev/null
done
cp -r "$C" "$R/chain"
cp "$A"/build-lucebox.* "$R/" 2>/dev/null
for f in json log seconds; do cp "$B/build-lucebox.$f" "$R/bsa-build-lucebox.$f" 2>/dev/null; done
tar -czf "$OUT/lease-$1.tgz" -C /tmp "lease-$1"
echo "call $1 done: $(elapsed)"
