#!/usr/bin/env bash
# Device run for issue 41: the Lucebox engine behind lucebox's front. `lucebox serve --engine
# lucebox` of the generated qwen35 target + Lucebox draft (benchmarks/lucebox_models.py) on
# 0.0.0.0 with an API key; then (benchmarks/front_clients_gpu.py) the official openai and anthropic SDKs
# (chat streaming, Responses, Messages), 16 streamed clients at once (all answered, in order,
# the longest silence of each), the front's overhead against the engine's private port, and the
# LAN address: refused without the key, served with it. Under 240 s; leaves no process.
# Run from the repo root: bash benchmarks/device/device_front.sh   (writes $OUT/front.json)
set -uo pipefail
source benchmarks/device/device_env.sh
OUT=${OUT:-/tmp/front-out}
mkdir -p "$OUT" benchmarks/results
W=.devrun/work/front
mkdir -p "$W"
PORT=18300
ENGINE_PORT=28300  # the planner's rule: the public port + 10000
KEY=device-front-$RANDOM$RANDOM
SERVE_PID=

finish() {
    if [ -n "$SERVE_PID" ]; then
        kill -TERM "$SERVE_PID" 2>/dev/null
        for _ in $(seq 1 20); do kill -0 "$SERVE_PID" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$SERVE_PID" 2>/dev/null
    fi
    # The key and the calibration switch-off were set for this run only: later runs in this
    # home serve without them.
    python3 -c "
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.machine import config
import os
config.reset_config(resolve_paths(dict(os.environ)))
" > /dev/null 2>&1
    return 0
}
trap finish EXIT

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
[ -f "$W/qwen35-tiny-dflash.gguf" ] || python3 benchmarks/lucebox_models.py "$W" pair > /dev/null || exit 1
T=$W/qwen35-tiny.gguf DR=$W/qwen35-tiny-dflash.gguf
python3 -c "
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.machine import config
import os
paths = resolve_paths(dict(os.environ))
config.set_setting(paths, 'server.api_key', '$KEY')
config.set_setting(paths, 'spec.calibrate_idle_s', '0')
" || exit 1
lucebox plan --model "$T" --draft "$DR" --engine lucebox --ctx 4096 --host 0.0.0.0 \
    --port "$PORT" --json > "$W/plan.json" 2> "$W/plan.err"
python3 -c "import json; d=json.load(open('$W/plan.json')); print('plan:', d['engine'], d['argv'][:8])"
lucebox serve --model "$T" --draft "$DR" --engine lucebox --ctx 4096 --host 0.0.0.0 \
    --port "$PORT" > "$W/serve.log" 2>&1 &
SERVE_PID=$!
state=$(wait_serve_ready "$SERVE_PID")
echo "serve state: $state"
tail -5 "$W/serve.log"
ss -ltnp 2>/dev/null | grep -E ":($PORT|$ENGINE_PORT) " | sed 's/users:.*//'
MODEL=$(curl -s -m 10 -H "Authorization: Bearer $KEY" "http://127.0.0.1:$PORT/v1/models" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])' 2>/dev/null)
echo "model: $MODEL"
LAN_IP=$(hostname -I 2>/dev/null | tr ' ' '\n' | grep -v '^127\.' | grep -v ':' | head -1)
timeout 150 python3 -m benchmarks.front_clients_gpu clients "http://127.0.0.1:$PORT" \
    "http://127.0.0.1:$ENGINE_PORT" "${MODEL:-qwen35-tiny}" "$KEY" > "$W/clients.json" \
    2> "$W/clients.err"
echo "clients rc $?"; tail -12 "$W/clients.err"
timeout 30 python3 -m benchmarks.front_clients_gpu lan "http://${LAN_IP:-127.0.0.1}:$PORT" "$KEY" \
    > "$W/lan.json" 2> "$W/lan.err"
echo "lan rc $?"; tail -3 "$W/lan.err"
lucebox status --json > "$W/status.json" 2>/dev/null
finish
SERVE_PID=
python3 - "$W" "$OUT/front.json" "$state" <<'PY'
import json, sys
from pathlib import Path
w, out, state = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
def load(name):
    try:
        return json.loads((w / name).read_text())
    except (OSError, ValueError) as exc:
        return {"error": f"{name}: {exc}"}
doc = {"serve_state": state, "plan": load("plan.json"), "clients": load("clients.json"),
       "lan": load("lan.json"), "status": load("status.json"),
       "serve_log_tail": (w / "serve.log").read_text(errors="replace")[-3000:]}
out.write_text(json.dumps(doc, indent=1))
Path("benchmarks/results/device_front.json").write_text(json.dumps(doc, indent=1))
c = doc["clients"]
sdk = c.get("sdk", {})
print("SDKs:", sdk.get("versions"), {k: v.get("ok") for k, v in sdk.items() if isinstance(v, dict) and "ok" in v})
many = c.get("many_clients", {})
print("16 clients: answered", many.get("all_answered"), "in order", many.get("in_order"),
      "max silence", many.get("max_silence_s"), "s", many.get("error", ""))
o = c.get("overhead", {})
print("overhead: TTFT +", o.get("ttft_added_ms"), "ms, decode cost", o.get("decode_cost_percent"), "%",
      "medians", o.get("median"), o.get("error", ""))
lan = doc["lan"]
print("LAN:", lan.get("url"), "ok", lan.get("ok"), lan.get("refused"), lan.get("served", {}).get("status"))
print("queue in status:", (doc["status"] or {}).get("queue"))
PY
