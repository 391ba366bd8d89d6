#!/usr/bin/env bash
# Device run: one Lucebox engine build's memory, per card, for the plan's per-build terms
# (benchmarks/lucebox_memory_by_stage.py in its raw form, the generated qwen35 pair of benchmarks/lucebox_models.py):
# one card at 4K and 32K tokens of q8_0 KV, plain and with the draft (DDTree budget 22), then on
# two cards the draft apart and tensor parallel (where the build offers them). Two context sizes
# part the per-token KV from the fixed terms; the plain/draft pair parts the draft's share.
# Needs the build under LUCEBOX_HOME (benchmarks/device/device_env.sh). VERSION picks it (default 4cf58a04);
# DEADLINE (epoch seconds) skips the runs that would start within 45 s of it.
# Writes $OUT/fit-VERSION.jsonl and the engine logs in $OUT/fit-VERSION-logs.tgz.
#   VERSION=4cf58a04 bash benchmarks/device/device_lucebox_fit.sh
set -uo pipefail
source benchmarks/device/device_env.sh
VERSION=${VERSION:-4cf58a04}
DEADLINE=${DEADLINE:-$(($(date +%s) + 300))}
export CUDA_DEVICE_ORDER=PCI_BUS_ID DFLASH_SAMPLED_VERIFY=1  # as lucebox launches it; NVML's order
ROOT=$PWD
M=$ROOT/.devrun/work/models
W=$ROOT/.devrun/work/fit-$VERSION
mkdir -p "$W"
MANIFEST=$(ls "$LUCEBOX_HOME"/data/engines/lucebox-"$VERSION"-*/manifest.json 2>/dev/null | head -1)
[ -n "$MANIFEST" ] || { echo "no Lucebox build $VERSION under $LUCEBOX_HOME"; exit 1; }
SERVER=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['server_path'])" "$MANIFEST")
[ -f "$M/qwen35-tiny-dflash.gguf" ] || python3 benchmarks/lucebox_models.py "$M" pair > /dev/null || exit 1
T=$M/qwen35-tiny.gguf DR=$M/qwen35-tiny-dflash.gguf
N_GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
HELP=$("$SERVER" --help 2>&1)
run() {  # name long_words -- engine args
    if [ $(($(date +%s) + 45)) -gt "$DEADLINE" ]; then echo "skipped $1: past the deadline"; return 0; fi
    (cd "$W" && timeout 120 python3 "$ROOT/bench/lucebox_memory.py" "$@") | tee -a "$OUT/fit-$VERSION.jsonl"
}
Q8="--cache-type-k q8_0 --cache-type-v q8_0 --max-tokens 512"
DRAFT="--draft $DR --ddtree --ddtree-budget 22"
run one-4k 2800 -- "$SERVER" "$T" --max-ctx 4096 $Q8
run one-32k 2800 -- "$SERVER" "$T" --max-ctx 32768 $Q8
run one-4k-draft 2800 -- "$SERVER" "$T" --max-ctx 4096 $Q8 $DRAFT
run one-32k-draft 2800 -- "$SERVER" "$T" --max-ctx 32768 $Q8 $DRAFT
if [ "$N_GPUS" -ge 2 ]; then
    if grep -q -- --target-split-mode <<< "$HELP"; then
        TP="--target-devices cuda:0,cuda:1 --target-split-mode tensor --peer-access"
        run tensor-4k 2800 -- "$SERVER" "$T" --max-ctx 4096 $Q8 $TP
        run tensor-32k 2800 -- "$SERVER" "$T" --max-ctx 32768 $Q8 $TP
        run tensor-32k-draft 2800 -- "$SERVER" "$T" --max-ctx 32768 $Q8 $TP $DRAFT
    fi
    if grep -q -- --draft-device <<< "$HELP"; then
        run apart-32k-draft 2800 -- "$SERVER" "$T" --max-ctx 32768 $Q8 $DRAFT \
            --target-device cuda:0 --draft-device cuda:1 --peer-access
    fi
fi
tar -czf "$OUT/fit-$VERSION-logs.tgz" -C "$W" .
