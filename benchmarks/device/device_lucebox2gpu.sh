#!/usr/bin/env bash
# Device run for issue 43, both engines on two GPUs, in one call: both engines already built by
# lucebox under LUCEBOX_HOME (benchmarks/device/device_env.sh). benchmarks/two_gpus_planned_vs_run.py measures, in this order:
# llama-server split vs one card (a filler holding all but 3.5 GiB of each card), the Lucebox
# engine with the generated qwen35 target + Lucebox draft (one card vs the draft on card 1 vs
# tensor parallel, 4cf58a04's build where installed), a served set of two models one per card;
# each with per-GPU planned vs nvidia-smi memory, decode tok/s and `status --json` gpus. On one
# GPU the two-card parts are listed as unrun. Parts not started within BUDGET_S - 110 s are
# skipped; the whole run is cut at BUDGET_S (default 390 s: with the set-up and the summary
# under 420 s), servers and filler stopped.
# PARTS reorders or narrows them (default split,one,lucebox,set; in a 240 s slot put lucebox
# first: BUDGET_S=230 PARTS=lucebox,split,one,set).
# Writes $OUT/lucebox2gpu.json (after each part), $OUT/lucebox2gpu.log, and the copy meant for
# benchmarks/results/ at $OUT/results/two-gpu-both-engines.json; prints a short summary.
#   bash benchmarks/device/device_lucebox2gpu.sh            # or BUDGET_S=230 bash benchmarks/device/device_lucebox2gpu.sh
set -uo pipefail
export PIP_NO_INDEX=1
source benchmarks/device/device_env.sh
BUDGET_S=${BUDGET_S:-390}
PARTS=${PARTS:-split,one,lucebox,set}
mkdir -p "$OUT/results" .devrun/work
lucebox down > /dev/null 2>&1  # a server left by an earlier call
nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv
nvidia-smi topo -m 2>/dev/null | head -4
start=$(date +%s)
timeout -k 20 "$BUDGET_S" python3 -m benchmarks.two_gpus_planned_vs_run --work .devrun/work \
    --parts "$PARTS" --budget-s $((BUDGET_S - 110)) --out "$OUT/lucebox2gpu.json" \
    > /dev/null 2> "$OUT/lucebox2gpu.log"
echo "two_gpu rc=$? in $(($(date +%s) - start)) s"
lucebox down > /dev/null 2>&1
cp "$OUT/lucebox2gpu.json" "$OUT/results/two-gpu-both-engines.json" 2> /dev/null
python3 - "$OUT/lucebox2gpu.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    sys.exit(f"no results: {exc}")
print("gpus", d.get("gpus"), "free MiB after filler", d.get("free_mib_after_filler"))
print("unrun", d.get("unrun"))

def memory(rows):
    for m in rows or []:
        print("     gpu", m.get("gpu"), "planned", m.get("planned_mib"), "smi",
              m.get("nvidia_smi_mib"), m.get("ratio"), m.get("within_5pct"), m.get("error", ""))

for part in ("split", "one"):
    r = d.get(part)
    if not r or "plan" not in r:
        print(part, r if not r else {k: str(v)[-600:] for k, v in r.items()})
        continue
    print(part, "ctx", r["plan"]["ctx"], r["plan"]["kv"], "decode", r["decode"]["median_tok_s"],
          "s", r["seconds"])
    memory(r["memory"])
    print("     status gpus", r.get("status_gpus"))
print("decode split/one", d.get("decode_split_over_one"))
lb = d.get("lucebox") or {}
print("lucebox build", lb.get("engine_id"), "unrun", lb.get("unrun"), lb.get("error", ""))
for b in lb.get("builds", []):
    print("   ", b["id"], "features", b["after"])
for p in ("one", "draft-apart", "tensor"):
    r = lb.get(p)
    if not r or "plan" not in r:
        print("lucebox", p, r if not r else {k: str(v)[-600:] for k, v in r.items()})
        continue
    print("lucebox", p, "ctx", r["plan"]["ctx"], "decode", r["decode"]["median_tok_s"],
          "s", r["seconds"])
    memory(r["memory"])
    print("     after decode:"); memory(r["memory_after_decode"])
    print("     status gpus", r.get("status_gpus"))
print("lucebox auto", lb.get("auto"))
s = d.get("set") or {}
for m in s.get("models", []):
    print("set", m["alias"], "planned gpu", m["planned_gpu"], "on", m["running_on_gpus"],
          "planned", m["planned_mib"], "smi", m["nvidia_smi_mib"])
print("set", {k: str(v)[-600:] for k, v in s.items() if k in ("error", "skipped")},
      "status gpus", s.get("status_gpus"))
PY
