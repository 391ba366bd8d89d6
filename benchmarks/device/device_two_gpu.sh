#!/usr/bin/env bash
# Device run for issue 43 (llama-server part) on a two-GPU kind: lucebox's own CUDA build of
# llama-server, then benchmarks/two_gpus_planned_vs_run.py (split vs one card vs a served set, planned vs
# nvidia-smi memory per GPU, decode tok/s, status --json gpus). Writes $OUT/two-gpu.json and
# $OUT/two-gpu.log. Run from the repo root with the wheels and the pinned sdist in .whl/.
# benchmarks.two_gpus_planned_vs_run also runs the Lucebox engine's part where a build is installed; this summary
# leaves it out (benchmarks/device/device_lucebox2gpu.sh prints it).
#   bash benchmarks/device/device_two_gpu.sh build    # starts the engine build detached and returns
#   bash benchmarks/device/device_two_gpu.sh [ARGS]   # waits for that build, then measures (ARGS go to
#                                         # benchmarks.two_gpus_planned_vs_run) on the same warm machine
set -uo pipefail
export PIP_NO_INDEX=1  # no network there: the web UI's node wheel fails at once, not after retries
source benchmarks/device/device_env.sh
pidfile=.devrun/build.pid
if [ "${1:-}" = build ]; then
    setsid nohup bash -c 'source benchmarks/device/device_env.sh; start=$(date +%s); ensure_engine
        echo "built in $(($(date +%s) - start)) s"' \
        > .devrun/build.out 2>&1 < /dev/null &
    echo $! > "$pidfile"
    echo "engine build started (pid $(cat "$pidfile")), log .devrun/build.out"
    exit 0
fi
if [ -f "$pidfile" ]; then
    waited=0
    while kill -0 "$(cat "$pidfile")" 2>/dev/null; do sleep 5; waited=$((waited + 5)); done
    echo "waited $waited s for the detached build:"; cat .devrun/build.out
fi
lucebox down > /dev/null 2>&1  # a server left by an earlier call cut short
start=$(date +%s)
ensure_engine
echo "engine ready after $(($(date +%s) - start)) s"
lucebox engine status --json > .devrun/engine-status.json
python3 -c "import json; e = json.load(open('.devrun/engine-status.json')); print(json.dumps(e)[:600])"
nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv
nvidia-smi topo -m || true
grep -m1 "model name" /proc/cpuinfo
python3 -m benchmarks.two_gpus_planned_vs_run --work .devrun/work "$@" > "$OUT/two-gpu.json" 2> >(tee "$OUT/two-gpu.log" >&2)
echo "two_gpu rc=$?"
python3 - "$OUT/two-gpu.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("free MiB after filler:", d.get("free_mib_after_filler"))
for part in ("split", "one"):
    r = d.get(part, {})
    if "plan" not in r:  # an error, a part skipped or not asked for
        print(part, {k: str(v)[-800:] for k, v in r.items()}); continue
    print(part, "ctx", r["plan"]["ctx"], r["plan"]["kv"], "split", r["plan"]["tensor_split"],
          "decode tok/s", r["decode"]["median_tok_s"], "seconds", r["seconds"])
    for m in r["memory"]:
        print("   gpu", m["gpu"], "planned", m["planned_mib"], "smi", m["nvidia_smi_mib"], m["ratio"])
    print("   status gpus", r["status_gpus"])
s = d.get("set", {})
if "error" in s:
    print("set ERROR", s["error"][-800:])
else:
    for m in s.get("models", []):
        print("set", m["alias"], "planned gpu", m["planned_gpu"], "on", m["running_on_gpus"],
              "planned", m["planned_mib"], "smi", m["nvidia_smi_mib"], "ctx", m["ctx"])
    print("   status gpus", s.get("status_gpus"))
print("decode split/one", d.get("decode_split_over_one"))
PY
