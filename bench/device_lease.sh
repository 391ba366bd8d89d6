#!/usr/bin/env bash
# A two-GPU lease's plan (nvidia-h200-x2: 32 cores, two cards), three calls back to back, each
# under CALL_S (580 s). Carry .whl and .devrun/carry in the first call, .devrun/oc (OpenCode) in
# the second; what a call leaves in .devrun/ stays while the machine is warm, and it goes back
# 30 s after a call returns: send the next call at once (a lease lost its builds so). Knobs:
# BSA_BUILD=0 (no BSA build), NO_VISION=1, FAULTS_ONLY=entries, KV_IN_TWO=1 (the KV set in
# call two, on card 0).
#   one    builds side by side: llama.cpp CUDA and the Lucebox engine 4cf58a04 without BSA in
#          .devrun/home, the Lucebox engine with BSA in .devrun/home-bsa; once the Lucebox build
#          is in, the fault bench on card 1, detached (a home of its own with a copy of that
#          build and of the models: it truncates its model and removes its binary); once
#          llama.cpp's is in, the vision run on card 0 (issues 37, 40, 44).
#   two    on card 0: OpenCode through `lucebox launch` (issue 41), the engine choice (39).
#   three  PFlash with BSA on card 0 (40) beside the exact cache vs KVFlash under a memory hold
#          on card 1 (39); the fault bench's results.
# Everything a call measured comes back as $OUT/lease-<phase>.tgz.
set -uo pipefail
export PIP_NO_INDEX=1
start=$(date +%s)
END=$((start + ${CALL_S:-580}))
source bench/device_env.sh
A=$LUCEBOX_HOME
B=$PWD/.devrun/home-bsa
F=$PWD/.devrun/home-faults
M=$PWD/.devrun/work/models
R=/tmp/lease-$1
rm -rf "$R"
mkdir -p "$R"
elapsed() { echo "$(($(date +%s) - start)) s"; }

faults_start() {
    # The fault bench's own home: a copy of the Lucebox build (its manifest names the copy) and
    # of the models, so its truncation and binary removal touch nothing the other runs use.
    local id
    id=$(python3 -c "import json; print(json.load(open('$A/build-lucebox.json'))['id'])") || return 1
    mkdir -p "$F/data/engines" "$F/models"
    cp -a "$A/data/engines/$id" "$F/data/engines/"
    sed -i "s#$A/#$F/#g" "$F/data/engines/$id/manifest.json"
    cp "$M/qwen35-tiny.gguf" "$M/qwen35-tiny-dflash.gguf" "$F/models/"
    local run="python3 -m bench.faults --engine lucebox --model $F/models/qwen35-tiny.gguf \
        --draft $F/models/qwen35-tiny-dflash.gguf --work $F/work --serve-args '--gpu 1'"
    # SIGILL last and alone: it starts a rebuild of the engine for the baseline CPU.
    CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1 LUCEBOX_HOME=$F setsid nohup bash -c "
        $run --only ${FAULTS_ONLY:-kill-9,sigstop,gpu-oom,truncated,port-taken,full-disk,binary-removed} \
            --out $F/faults.json > $F/faults.log 2>&1
        $run --only sigill --out $F/faults-sigill.json > $F/faults-sigill.log 2>&1
        echo done > $F/faults.done
    " > /dev/null 2>&1 < /dev/null &
}

case "$1" in
one)
    nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total --format=csv | tee "$R/gpu.txt"
    BSA=0 bash bench/device_session.sh start > "$R/start.txt" 2>&1
    [ "${BSA_BUILD:-1}" = 1 ] && LUCEBOX_HOME=$B BSA=1 bash bench/device_session.sh start-lucebox >> "$R/start.txt" 2>&1
    echo "builds started, models written: $(elapsed)"
    faults=0 vision=${NO_VISION:-0}
    while [ "$(date +%s)" -lt $((END - 20)) ]; do
        if [ $faults = 0 ] && [ -f "$A/build-lucebox.rc" ]; then
            faults=1
            echo "Lucebox build rc $(cat "$A/build-lucebox.rc") in $(cat "$A/build-lucebox.seconds") s"
            [ "$(cat "$A/build-lucebox.rc")" = 0 ] && faults_start && echo "faults started: $(elapsed)"
        fi
        if [ $vision = 0 ] && [ -f "$A/build-llama.rc" ] && [ $((END - $(date +%s))) -gt 200 ]; then
            vision=1
            echo "llama.cpp build rc $(cat "$A/build-llama.rc") in $(cat "$A/build-llama.seconds") s"
            mkdir -p "$R/vision"
            [ "$(cat "$A/build-llama.rc")" = 0 ] && OUT=$R/vision timeout 190 bash bench/device_vision.sh \
                > "$R/vision.txt" 2>&1 && echo "vision done: $(elapsed)"
        fi
        [ $faults = 1 ] && [ $vision = 1 ] && break
        sleep 2
    done
    ;;
two)
    mkdir -p "$R/opencode" "$R/choice"
    OUT=$R/opencode timeout 200 bash bench/device_opencode.sh > "$R/opencode.txt" 2>&1
    echo "opencode rc $?: $(elapsed)"; tail -n 8 "$R/opencode.txt"
    if [ "${KV_IN_TWO:-0}" = 1 ]; then
        mkdir -p "$R/kv"
        CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0 timeout 300 python3 bench/long_prompt_device.py \
            "$M" "$R/kv/kv.json" --set kv --port 18240 --serve-args "--gpu 0" \
            --deadline $(($(date +%s) + 280)) > "$R/kv.txt" 2>&1
        echo "kv rc $?: $(elapsed)"; tail -n 12 "$R/kv.txt"
    fi
    if [ "$(cat "$A/build-llama.rc" 2>/dev/null)" = 0 ] && [ $((END - $(date +%s))) -gt 240 ]; then
        OUT=$R/choice timeout 235 bash bench/device_engine_choice.sh > "$R/choice.txt" 2>&1
        echo "engine choice rc $?: $(elapsed)"; tail -n 20 "$R/choice.txt"
    fi
    if [ ! -s "$R/../lease-one/vision/vision.json" ] && [ $((END - $(date +%s))) -gt 200 ]; then
        mkdir -p "$R/vision"
        OUT=$R/vision timeout 190 bash bench/device_vision.sh > "$R/vision.txt" 2>&1
        echo "vision rc $?: $(elapsed)"
    fi
    ;;
three)
    mkdir -p "$R/pflash" "$R/kv"
    echo "BSA build: rc $(cat "$B/build-lucebox.rc" 2>/dev/null || echo running) in $(cat "$B/build-lucebox.seconds" 2>/dev/null || echo '?') s"
    cp "$B/build-lucebox.json" "$B/build-lucebox.log" "$R/" 2>/dev/null
    (CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1 timeout $((END - 20 - $(date +%s))) \
        python3 bench/long_prompt_device.py "$M" "$R/kv/kv.json" --set kv --port 18240 \
        --serve-args "--gpu 1" --deadline $((END - 40)) > "$R/kv.txt" 2>&1) &
    kv=$!
    if [ "$(cat "$B/build-lucebox.rc" 2>/dev/null)" = 0 ]; then
        LUCEBOX_HOME=$B SERVE_ARGS="--gpu 0" OUT=$R/pflash timeout $((END - 15 - $(date +%s))) \
            bash bench/device_pflash.sh > "$R/pflash.txt" 2>&1
        echo "pflash rc $?: $(elapsed)"; tail -n 12 "$R/pflash.txt"
    fi
    wait $kv
    echo "kv rc $?: $(elapsed)"; tail -n 12 "$R/kv.txt"
    ;;
*)
    echo "usage: device_lease.sh one|two|three" >&2
    exit 2
    ;;
esac
# The fault bench's progress (it runs across calls).
cp "$F"/faults*.json "$F"/faults*.log "$R/" 2>/dev/null
[ -f "$F/faults.done" ] && echo "faults: done" || echo "faults: $(grep -c '^# ' "$F/faults.log" 2>/dev/null) entries begun"
tail -n 14 "$F/faults.log" 2>/dev/null
cp "$A"/build-*.json "$A"/build-*.seconds "$R/" 2>/dev/null
tar -czf "$OUT/lease-$1.tgz" -C /tmp "lease-$1"
echo "call $1 done: $(elapsed)"
