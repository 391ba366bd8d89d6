#!/usr/bin/env bash
# The measuring half of benchmarks/device/device_lucebox.sh (run by it, from the repo root, with
# LUCEBOX_HOME set and the engine installed). Writes $OUT/measure.tgz.
set -uo pipefail
H=$LUCEBOX_HOME
W=$H/measure
rm -rf "$W"; mkdir -p "$W"
lucebox() { python3 -m lucebox.app.cli "$@"; }
MANIFEST=$(ls "$H"/data/engines/lucebox-*/manifest.json | head -1)
SERVER=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['server_path'])" "$MANIFEST")
cp "$MANIFEST" "$W/manifest.json"
want() { [ -z "${CONFIGS:-}" ] || [[ " $CONFIGS " == *" $1 "* ]]; }
"$SERVER" --help > "$W/help.txt" 2>&1; echo "help exit $?" >> "$W/help.txt.rc"
lucebox engine status --json > "$W/engine-status.json" 2>&1

M=$H/models
mkdir -p "$M"
start=$(date +%s)
python3 benchmarks/lucebox_models.py "$M" "${MODELS:-all}" || exit 1
echo "models written in $(( $(date +%s) - start )) s"; ls -la "$M"
T=$M/qwen35-tiny.gguf
DR=$M/qwen35-tiny-dflash.gguf
MTP=$M/qwen35-tiny-mtp.gguf
PD=$M/qwen3-tiny-drafter.gguf
PORT=18180
URL=http://127.0.0.1:$PORT
LONG=$(python3 -c "print(' '.join(['hello world the model test'] * 560))")

chat() {  # name body
    curl -s -m 120 "$URL/v1/chat/completions" -H 'Content-Type: application/json' -d "$2" \
        > "$W/$1.json"
    python3 - "$W/$1.json" <<'PY'
import json, sys
try:
    data = json.load(open(sys.argv[1]))
    print(sys.argv[1].rsplit("/", 1)[1], json.dumps(data.get("usage") or data.get("error")))
except Exception as exc:
    print(sys.argv[1], "unreadable:", exc)
PY
}

greedy='{"messages":[{"role":"user","content":"Write a long story about a model."}],"max_tokens":256,"temperature":0}'
sampled='{"messages":[{"role":"user","content":"Write a long story about a model."}],"max_tokens":256,"temperature":0.7}'
unset_temp='{"messages":[{"role":"user","content":"Write a long story about a model."}],"max_tokens":256}'
no_max='{"messages":[{"role":"user","content":"hi"}],"temperature":0}'
long_prompt="{\"messages\":[{\"role\":\"user\",\"content\":\"$LONG\"}],\"max_tokens\":128,\"temperature\":0}"

serve_cfg() {  # name requests... -- engine args
    local name=$1; shift
    local requests=()
    while [ "$1" != "--" ]; do requests+=("$1"); shift; done; shift
    echo "== $name: $*"
    "$SERVER" "$@" --host 127.0.0.1 --port $PORT --model-name tiny > "$W/$name.log" 2>&1 &
    local pid=$! ready=0 t0
    t0=$(date +%s.%N)
    for _ in $(seq 1 600); do
        curl -sf -m 1 "$URL/health" > /dev/null && { ready=1; break; }
        kill -0 $pid 2>/dev/null || break
        sleep 0.2
    done
    echo "$name ready=$ready in $(python3 -c "import time;print(round(time.time()-$t0,2))") s"
    if [ $ready = 1 ]; then
        chat "$name.warmup" '{"messages":[{"role":"user","content":"hello"}],"max_tokens":8,"temperature":0}'
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits > "$W/$name.smi.txt"
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader >> "$W/$name.smi.txt"
        echo "$name nvidia-smi after warm-up: $(tr '\n' ' ' < "$W/$name.smi.txt")"
        local i=0
        for body in "${requests[@]}"; do i=$((i + 1)); chat "$name.r$i" "${!body}"; done
        curl -sN -m 60 "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
            -d "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":16,\"temperature\":0,\"stream\":true}" \
            > "$W/$name.stream.txt"
        curl -s -m 5 "$URL/status/json" > "$W/$name.status.json"
        curl -s -m 5 "$URL/props" > "$W/$name.props.json"
    fi
    kill -TERM $pid 2>/dev/null; wait $pid; echo "$name exit $?" | tee -a "$W/$name.log"
    grep -E "^\[(spec-decode|ar-decode|kvflash|target|draft)\]|chat DONE|listening|error|fail" \
        "$W/$name.log" | head -20
}

want plain && serve_cfg plain greedy no_max -- "$T" --max-ctx 4096 --max-tokens 512
want plain-64k && serve_cfg plain-64k greedy -- "$T" --max-ctx 65536 --max-tokens 512
want chain && serve_cfg chain greedy -- "$T" --draft "$DR" --max-ctx 4096 --max-tokens 512
want ddtree && serve_cfg ddtree greedy sampled unset_temp -- "$T" --draft "$DR" --ddtree --ddtree-budget 22 \
    --max-ctx 4096 --max-tokens 512
want ddtree-sampled-verify && DFLASH_SAMPLED_VERIFY=1 serve_cfg ddtree-sampled-verify sampled -- "$T" --draft "$DR" --ddtree \
    --ddtree-budget 22 --fa-window 0 --max-ctx 4096 --max-tokens 512
want kvflash && serve_cfg kvflash long_prompt greedy -- "$T" --kvflash 1024 --kvflash-policy lru --max-ctx 4096 \
    --max-tokens 512
want kvflash-auto && serve_cfg kvflash-auto greedy -- "$T" --kvflash auto --kvflash-policy lru --max-ctx 65536 \
    --max-tokens 512
want pflash && serve_cfg pflash long_prompt -- "$T" --prefill-compression auto --prefill-threshold 1000 \
    --prefill-drafter "$PD" --max-ctx 4096 --max-tokens 512
want mtp-target && serve_cfg mtp-target greedy -- "$MTP" --max-ctx 4096 --max-tokens 512

lucebox_serve() {  # name, lucebox serve arguments
    local name=$1; shift
    echo "== lucebox serve $*"
    lucebox plan "$@" --json > "$W/$name.plan.json" 2> "$W/$name.plan.err"
    lucebox serve "$@" --port 18190 > "$W/$name.log" 2>&1 &
    local serve_pid=$! s=
    for _ in $(seq 1 240); do
        s=$(lucebox status --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])' 2>/dev/null)
        [ "$s" = ready ] || [ "$s" = failed ] && break; sleep 0.5
    done
    echo "$name state: $s"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader > "$W/$name.smi.txt"
    local URL=http://127.0.0.1:18190 i=0
    for body in ${BODIES:-greedy sampled unset_temp greedy}; do
        i=$((i + 1))
        curl -s -m 300 "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
            -d @<(printf '%s' "${!body}") -w '\n%{time_total}\n' > "$W/$name.r$i.json"
        python3 - "$W/$name.r$i.json" "$body" <<'PY'
import json, sys
text = open(sys.argv[1]).read().rsplit("\n", 2)
data = json.loads(text[0])
print(sys.argv[2], f"wall {float(text[1]):.2f} s", json.dumps(data.get("usage") or data)[:600])
PY
    done
    sleep 2.5
    lucebox status --json > "$W/$name.status.json" 2>&1
    python3 - "$W/$name.status.json" "$W/$name.plan.json" "$W/$name.smi.txt" <<'PY'
import json, sys
status = json.load(open(sys.argv[1]))
print("status:", json.dumps({k: status.get(k) for k in ("state", "sample", "spec")})[:1500])
plan = json.load(open(sys.argv[2]))
used = [int(l.split(",")[1].split()[0]) for l in open(sys.argv[3]) if "," in l]
total = plan["memory_bytes"]["total"] / 2**20
print(f"plan total {total:.0f} MiB vs nvidia-smi {used} MiB; engine {plan['engine']}")
PY
    lucebox down > /dev/null 2>&1
    wait $serve_pid; echo "$name serve exit $?"
    grep -E "warm-up|lucebox: (engine|plan|server)" "$W/$name.log" | head -8
}
want serve-ddtree && lucebox_serve serve-ddtree --model "$T" --draft "$DR"
want serve-plain && BODIES="greedy sampled unset_temp long_prompt" \
    lucebox_serve serve-plain --model "$T" --engine lucebox --ctx 4096
# KVFlash planned by lucebox on a card with little free memory, as when a game or another
# model holds the rest: a CUDA process holds all but 2,260 MiB, so at 128K context the plan
# finds room for the largest pool (16K tokens) but not for the whole context; the prompt is 4x
# the planned pool.
if want serve-kvflash; then
    python3 - <<'PY' &
import time, torch
free, _ = torch.cuda.mem_get_info()
hold = torch.empty(free - 2260 * 2**20, dtype=torch.uint8, device="cuda")
print(f"holding {hold.numel() / 2**30:.1f} GiB; free now {torch.cuda.mem_get_info()[0] / 2**20:.0f} MiB",
      flush=True)
time.sleep(900)
PY
    holder=$!
    sleep 15
    nvidia-smi --query-gpu=memory.used,memory.free --format=csv,noheader
    pool=$(lucebox plan --model "$T" --engine lucebox --ctx 131072 --json \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["kvflash_pool_tokens"])')
    reps=$(( pool * 4 * 100 / 507 ))
    LONG4=$(python3 -c "print(' '.join(['hello world the model test'] * $reps))")
    long4_prompt="{\"messages\":[{\"role\":\"user\",\"content\":\"$LONG4\"}],\"max_tokens\":128,\"temperature\":0}"
    echo "KVFlash pool $pool tokens, prompt of $reps repetitions (~$(( reps * 507 / 100 )) tokens)"
    BODIES="long4_prompt greedy" lucebox_serve serve-kvflash --model "$T" --engine lucebox \
        --ctx 131072
    kill $holder
fi
# PFlash through lucebox: its drafter pulled like any model, from a local Hub serving the
# generated stand-in under the real file's name (this machine has no network).
if want serve-pflash; then
    python3 - "$PD" <<'PY' &
import pathlib, sys, time
from support.hubserver import HubFile, HubState, serve_hub
state = HubState()
body = pathlib.Path(sys.argv[1]).read_bytes()
state.add("unsloth/Qwen3-0.6B-GGUF", "Qwen3-0.6B-BF16.gguf", HubFile(body))
with serve_hub(state) as hub:
    pathlib.Path("/tmp/lucebox-hub.url").write_text(hub.base_url)
    time.sleep(900)
PY
    hub_pid=$!
    for _ in $(seq 1 60); do [ -s /tmp/lucebox-hub.url ] && break; sleep 0.5; done
    HF_ENDPOINT=$(cat /tmp/lucebox-hub.url) BODIES="long_prompt greedy" \
        lucebox_serve serve-pflash --model "$T" --engine lucebox --prefill pflash --ctx 4096
    kill $hub_pid
fi

# Both engines on the same files, one after the other (needs llama.cpp's CUDA build in this
# LUCEBOX_HOME too: benchmarks/device/device_env.sh's ensure_engine, run first on this warm machine).
if want compare-engines; then
    lucebox bench quick --model "$T" --draft "$DR" --compare engine=lucebox,llama-server --json \
        > "$W/compare-engines.json" 2> "$W/compare-engines.err"
    echo "compare exit $?"; tail -5 "$W/compare-engines.err"
    python3 - "$W/compare-engines.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
for side, probes in report["configs"].items():
    for name, sample in probes.items():
        print(side, name, {k: sample.get(k) for k in ("decode_tok_s", "prefill_tok_s", "ttft_s", "acceptance")})
print({k: v for k, v in report.items() if k.endswith("ratio")})
PY
fi
tar -czf "$OUT/measure.tgz" -C "$H" measure
ls -la "$OUT"
