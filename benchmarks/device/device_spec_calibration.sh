#!/usr/bin/env bash
# Device run for the speculation calibration (issue 30), in two calls on one warm machine:
#   bash benchmarks/device/device_spec_calibration.sh build     the CUDA engine (lucebox engine build) and
#                                                   three generated 1.7 GB qwen35 targets
#   bash benchmarks/device/device_spec_calibration.sh measure   lucebox serve --model M (--spec auto) on each,
#                                                   until the calibration has chosen; the figures
# The targets (F16, 16 trunk layers, width x32 with 128-wide attention heads, 32k vocabulary):
# an MTP head that always agrees (agree_token), one of random weights that never agrees (auto
# plans it with p-min 0.75), and one that agrees part of the time (benchmarks/partial_head.py).
# The engine, the models and the store live in /tmp, outside the carried folder: a carried
# path is replaced on every call, so a home inside it loses the engine the build call made.
# Writes to $OUT (at most 8 files come back): summary.json, the store, statuses.jsonl /
# statuses.txt, serve-tails.txt, and bench quick's run on the random head.
set -uo pipefail
source benchmarks/device/device_env.sh
export LUCEBOX_HOME=/tmp/lucebox-spec-home
WORK=/tmp/lucebox-spec-work
models() {  # SCALE and LAYERS shrink them for a try on a CPU
    python3 - <<'PY'
import os, subprocess, sys
from dataclasses import replace
from pathlib import Path
from support.ggufgen import cached_gguf, qwen35_target, widen
work = Path("/tmp/lucebox-spec-work")
scale, layers = os.environ.get("SCALE", "32"), os.environ.get("LAYERS", "16")
# A 16k native context: bench quick's long-document prompt needs more than the default 2k.
# Attention heads of 128 (16 query, 8 KV: the widened projections' sizes): the tests' head
# size of 16 has no CUDA flash-attention kernel, so llama.cpp runs that attention on the CPU
# and decode slows with every token of context, which is not what a real model does.
shape = widen(qwen35_target(n_layer=int(layers), vocab_size=32000, n_ctx=16384), int(scale))
shape = replace(shape, n_head=max(1, shape.n_head // 8), n_head_kv=max(1, shape.n_head_kv // 8),
                head_dim=128)
agree = cached_gguf(replace(shape, agree_token="hello"), work)
never = cached_gguf(shape, work)
partial = work / "partial.gguf"
if not partial.exists():
    subprocess.run([sys.executable, "-m", "benchmarks.partial_head", str(agree), str(partial),
                    "--vocab", "32000", "--scale", scale, "--layers", layers], check=True)
for name, path in (("agree", agree), ("never", never), ("partial", partial)):
    (work / f"{name}.path").write_text(str(path))
    print(name, path, path.stat().st_size)
PY
}
if [ "${1:-measure}" = build ]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
    mkdir -p "$WORK"
    models > "$OUT/models.txt" 2>&1 &
    models_pid=$!
    start=$(date +%s)
    ensure_engine
    echo "engine in $(( $(date +%s) - start )) s"
    wait $models_pid; echo "models rc=$?"; cat "$OUT/models.txt"
    lucebox engine status --json > "$OUT/engine-status.json"
    exit 0
fi
lucebox engine status --json | python3 -c 'import json, sys; sys.exit(not json.load(sys.stdin)["selected"])' \
    || { echo "no engine in $LUCEBOX_HOME: run the build call first, on this warm machine"; exit 1; }
models >> "$OUT/serve-tails.txt" 2>&1 || exit 1  # a build call that ran out of time
lucebox config set spec.calibrate_idle_s 2 > /dev/null || exit 1
calibrate() {  # name: serve that target until its calibration has chosen and the choice runs
    local name=$1 model
    model=$(cat "$WORK/$name.path")
    local start=$(date +%s)
    lucebox serve --model "$model" --port 18091 > "$WORK/serve-$name.log" 2>&1 &
    local serve_pid=$!
    python3 - "$name" "$serve_pid" <<'PY'
import json, os, subprocess, sys, time
name, serve_pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 200
status = {}
while time.monotonic() < deadline and os.path.exists(f"/proc/{serve_pid}"):
    done = subprocess.run([sys.executable, "-m", "lucebox.app.cli", "status", "--json"],
                          capture_output=True, text=True)
    status = json.loads(done.stdout or "{}")
    spec = status.get("spec") or {}
    if status.get("state") == "ready" and spec.get("measured") and \
            not spec.get("reason", "").startswith("measuring"):
        break
    time.sleep(0.5)
with open(f"{__import__('os').environ['OUT']}/statuses.jsonl", "a") as out:
    out.write(json.dumps({"model": name, **status}) + "\n")
print(name, status.get("state"), json.dumps(status.get("spec")))
PY
    lucebox status | tee -a "$OUT/statuses.txt"
    lucebox down > /dev/null
    wait $serve_pid
    echo "$name: calibrated and stopped in $(( $(date +%s) - start )) s"
    { echo "== $name"; tail -n 40 "$WORK/serve-$name.log"; } >> "$OUT/serve-tails.txt"
}
start=$(date +%s)
for name in agree never partial; do calibrate $name; done
cp "$LUCEBOX_HOME/data/spec-measurements.json" "$OUT/spec-measurements.json"
python3 - <<'PY' | tee "$OUT/summary.json"
import json, os
from pathlib import Path
home, work = Path(os.environ["LUCEBOX_HOME"]), Path("/tmp/lucebox-spec-work")
entries = json.loads((home / "data/spec-measurements.json").read_text())["entries"]
names = {Path((work / f"{n}.path").read_text()).name: n for n in ("agree", "never", "partial")}
summary = {}
for entry in entries.values():
    name = names[entry["key"]["model"].split(":")[0]]
    trials = {t["label"]: t for t in entry["trials"]}
    base = trials["off"]["tok_s"]
    chosen = entry["chosen"]
    best = max(t["tok_s"] for t in trials.values())
    summary[name] = {
        "chosen": chosen,
        "chosen_ratio": round(trials[chosen]["tok_s"] / base, 3),
        "chosen_vs_best": round(trials[chosen]["tok_s"] / best, 3),
        "rates": {label: {"tok_s": t["tok_s"], "ratio": round(t["tok_s"] / base, 3),
                          "drafted": sum(p["drafted"] for p in t["probes"]),
                          "accepted": sum(p["accepted"] for p in t["probes"])}
                  for label, t in trials.items()},
        "why": entry["why"],
    }
checks = {
    "agree keeps >= 1.4x": summary["agree"]["chosen_ratio"] >= 1.4,
    "never ends >= 0.95x of off": summary["never"]["chosen_ratio"] >= 0.95,
    "partial within 5% of the best": summary["partial"]["chosen_vs_best"] >= 0.95,
}
print(json.dumps({"summary": summary, "checks": checks}, indent=1))
PY
echo "calibrations in $(( $(date +%s) - start )) s"
# The same probes through bench quick, with the store's verdict (spec=on) against none.
if [ $(( $(date +%s) - start )) -lt 330 ]; then
    lucebox bench quick --model "$(cat $WORK/never.path)" --compare spec=on,off --json \
        > "$OUT/quick-never.json" 2> "$OUT/quick-never.err"
    python3 -c "import json; print('bench quick never-agreeing head, on/off:', \
json.load(open('$OUT/quick-never.json'))['decode_ratio'])" || tail -3 "$OUT/quick-never.err"
fi
