#!/usr/bin/env bash
# Device run (issue 39): the long-context mode measurement of `lucebox serve` itself on the GPU.
# The generated qwen35 target served by the Lucebox engine at a 65,536-token context with the
# calibration's idle wait at 5 s: once idle, lucebox measures each mode its planner can serve
# there (exact at q8_0 and q4_0, a KVFlash pool at each) over the probes and a 32K-token probe,
# a restart each, then serves the planned mode again. Records `status --json` as it goes, the
# modes `plan` shows afterwards, and the engine command lines. A home of its own (KV_HOME) with a
# copy of the Lucebox build in FROM_HOME (its manifest names the copy) and the models in MODELS.
# SERVE_ARGS: more arguments (--gpu 0). Writes $OUT/kv-calibration.json; leaves no process.
set -uo pipefail
started=$(date +%s)
source benchmarks/device/device_env.sh
H=${KV_HOME:-$PWD/.devrun/home-kvcal}
FROM=${FROM_HOME:-$PWD/.devrun/home}
MODELS=${MODELS:-$PWD/.devrun/work/models}
LIMIT_S=${LIMIT_S:-300}
id=$(python3 -c "import json; print(json.load(open('$FROM/build-lucebox.json'))['id'])") || exit 1
mkdir -p "$H/data/engines"
[ -d "$H/data/engines/$id" ] || cp -a "$FROM/data/engines/$id" "$H/data/engines/"
sed -i "s#$FROM/#$H/#g" "$H/data/engines/$id/manifest.json"
export LUCEBOX_HOME=$H
lucebox config set spec.calibrate_idle_s 5 > /dev/null
target=$MODELS/qwen35-tiny.gguf
args=(--model "$target" --engine lucebox --ctx 65536 --port 18260 ${SERVE_ARGS:-})
setsid python3 -m lucebox.app.cli serve "${args[@]}" > "$OUT/kv-serve.log" 2>&1 &
serve=$!
trap 'lucebox down > /dev/null 2>&1; kill -- -$serve 2> /dev/null' EXIT
samples=$OUT/kv-status.ndjson
: > "$samples"
state=
while [ $(( $(date +%s) - started )) -lt "$LIMIT_S" ]; do
    lucebox status --json > "$OUT/kv-status-now.json" 2> /dev/null
    state=$(python3 - "$OUT/kv-status-now.json" "$samples" <<'PY'
import json, sys
try:
    status = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    print("none"); sys.exit(0)
modes = status.get("kv_modes") or {}
with open(sys.argv[2], "a") as out:
    out.write(json.dumps({"state": status.get("state"), "kv_modes": modes}) + "\n")
print(f"{status.get('state')}/{modes.get('state')}")
PY
)
    [ "$state" = ready/done ] && break
    kill -0 $serve 2> /dev/null || break
    sleep 2
done
echo "state $state after $(( $(date +%s) - started )) s"
lucebox status > "$OUT/kv-status.txt" 2>&1
lucebox plan "${args[@]}" > "$OUT/kv-plan.txt" 2>&1
lucebox plan "${args[@]}" --json > "$OUT/kv-plan.json" 2>&1
cp "$H/data/spec-measurements.json" "$OUT/kv-store.json" 2> /dev/null
log=$(python3 -c "from lucebox.engine.core.paths import resolve_paths; from lucebox.engine.run.runstate import engine_log; print(engine_log(resolve_paths()))")
cp "$log" "$OUT/kv-engine.log" 2> /dev/null
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
lines = (out / "kv-status.ndjson").read_text().splitlines()
last = json.loads(lines[-1]) if lines else {}
log = out / "kv-engine.log"
starts = []
for line in (log.read_text(errors="replace").splitlines() if log.is_file() else []):
    if line.startswith("# lucebox: starting "):
        argv = line.split()
        kv = argv[argv.index("--cache-type-k") + 1] if "--cache-type-k" in argv else None
        pool = argv[argv.index("--kvflash") + 1] if "--kvflash" in argv else None
        starts.append({"cache_type": kv, "kvflash_pool": pool})
document = {"samples": len(lines), "last": last, "engine_starts": starts,
            "plan": (out / "kv-plan.txt").read_text()[-3000:]}
print("engine starts:", starts)
(out / "kv-calibration.json").write_text(json.dumps(document, indent=1) + "\n")
for mode in (last.get("kv_modes") or {}).get("modes", []):
    print(mode)
PY
cat "$OUT/kv-status.txt" | tail -8
