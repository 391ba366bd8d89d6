#!/usr/bin/env bash
# Device run for serve: `lucebox serve` with the CUDA engine (built by device_plan.sh into
# .devrun/, which lasts while the machine stays warm) on a generated model; `status --json`
# while a long request runs and after it, then `down`. Argument: a support/ggufgen SHAPES name.
set -uo pipefail
source benchmarks/device/device_env.sh
ensure_engine
model=$(generated_model "${1:-llama8b}")
lucebox serve --model "$model" --port 18090 > "$OUT/serve.log" 2>&1 &
serve_pid=$!
state() { lucebox status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])'; }
for _ in $(seq 1 300); do [ "$(state)" = ready ] && break; sleep 0.5; done
echo "state: $(state)"
curl -s localhost:18090/v1/chat/completions -H 'Content-Type: application/json' \
    -d '{"messages":[{"role":"user","content":"Write a long story."}],"max_tokens":3000,
         "ignore_eos":true}' > "$OUT/completion.json" &
curl_pid=$!
sleep 4
lucebox status --json | tee "$OUT/status-during-request.json"
nvidia-smi --query-gpu=memory.used,utilization.gpu,temperature.gpu,power.draw --format=csv \
    | tee "$OUT/nvidia-smi-during-request.txt"
wait $curl_pid
sleep 2.5
lucebox status --json | tee "$OUT/status-after-request.json"
engine_pid=$(lucebox status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["engine_pid"])')
lucebox down
wait $serve_pid; echo "serve exit: $?"
if kill -0 "$engine_pid" 2>/dev/null; then echo "engine $engine_pid still running"; else
    echo "engine $engine_pid gone after down"; fi
tail -5 "$OUT/serve.log"
