#!/usr/bin/env bash
# Device run: the Lucebox engine's memory by stage (benchmarks/lucebox_memory_by_stage.py), raw and through
# `lucebox serve`, for plain, DDTree, KVFlash and PFlash on the generated pair. Run from the
# repo root after `benchmarks/device/device_lucebox.sh restore` (or a build on this warm machine).
# Writes $OUT/memory.jsonl and the logs in $OUT/memory-logs.tgz.
set -uo pipefail
ROOT=$PWD
export LUCEBOX_HOME=$ROOT/.devrun/27home PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/site:$ROOT/.typecheck:$ROOT
H=$LUCEBOX_HOME
W=$H/memory
mkdir -p "$W"
MANIFEST=$(ls "$H"/data/engines/lucebox-*/manifest.json | head -1)
SERVER=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['server_path'])" "$MANIFEST")
M=$H/models
[ -f "$M/qwen3-tiny-drafter.gguf" ] || python3 benchmarks/lucebox_models.py "$M" all > /dev/null || exit 1
T=$M/qwen35-tiny.gguf DR=$M/qwen35-tiny-dflash.gguf PD=$M/qwen3-tiny-drafter.gguf
want() { [ -z "${CONFIGS:-}" ] || [[ " $CONFIGS " == *" $1 "* ]]; }
run() {  # name long_words -- command
    want "$1" || return 0
    (cd "$W" && python3 "$ROOT/bench/lucebox_memory.py" "$@") | tee -a "$OUT/memory.jsonl"
}
Q8="--cache-type-k q8_0 --cache-type-v q8_0"
run plain-4k-q8 2800 -- "$SERVER" "$T" --max-ctx 4096 --max-tokens 512 $Q8
run plain-4k-q4 2800 -- "$SERVER" "$T" --max-ctx 4096 --max-tokens 512
run plain-128k-q4 60000 -- "$SERVER" "$T" --max-ctx 131072 --max-tokens 512
run kvflash-128k-q4 60000 -- "$SERVER" "$T" --max-ctx 131072 --max-tokens 512 --kvflash 16384 \
    --kvflash-policy lru
run pflash-4k-q8 2800 -- "$SERVER" "$T" --max-ctx 4096 --max-tokens 512 $Q8 \
    --prefill-compression always --prefill-drafter "$PD"
run ddtree-4k-q8 2800 -- "$SERVER" "$T" --max-ctx 4096 --max-tokens 512 $Q8 --draft "$DR" \
    --ddtree --ddtree-budget 22
run serve-plain 2800 -- serve --model "$T" --engine lucebox --ctx 4096
run serve-ddtree 2800 -- serve --model "$T" --draft "$DR"
if want serve-pflash; then
    python3 - "$PD" <<'PY' &
import pathlib, sys, time
from support.hubserver import HubFile, HubState, serve_hub
state = HubState()
state.add("unsloth/Qwen3-0.6B-GGUF", "Qwen3-0.6B-BF16.gguf", HubFile(pathlib.Path(sys.argv[1]).read_bytes()))
with serve_hub(state) as hub:
    pathlib.Path("/tmp/lucebox-hub.url").write_text(hub.base_url)
    time.sleep(900)
PY
    hub_pid=$!
    for _ in $(seq 1 60); do [ -s /tmp/lucebox-hub.url ] && break; sleep 0.5; done
    HF_ENDPOINT=$(cat /tmp/lucebox-hub.url) run serve-pflash 2800 -- serve --model "$T" \
        --engine lucebox --prefill pflash --ctx 4096
    kill $hub_pid
fi
# KVFlash as lucebox plans it on a card another CUDA process mostly holds (a game, a second
# model): all but 2,800 MiB taken, 256K asked for, so the plan keeps a 16K-token pool (its peak,
# 2.6 GiB, fits; the whole context's KV does not); the prompt is about 4x the pool.
if want serve-kvflash; then
    python3 -c "
import time, torch
free, _ = torch.cuda.mem_get_info()
hold = torch.empty(free - 2800 * 2**20, dtype=torch.uint8, device='cuda')
print('holding', hold.numel() >> 20, 'MiB', flush=True)
time.sleep(900)" &
    holder=$!
    sleep 12
    run serve-kvflash 62000 -- serve --model "$T" --engine lucebox --ctx 262144
    kill $holder
fi
tar -czf "$OUT/memory-logs.tgz" -C "$H" memory
