#!/usr/bin/env bash
# Device run for issue 41: OpenCode (the real client, npm opencode-ai 1.18.33's linux-x64 binary,
# carried xz-compressed in .devrun/oc/opencode.xz) through `lucebox launch opencode` against
# `lucebox serve --engine lucebox` of the generated qwen35 target + Lucebox draft
# (benchmarks/lucebox_models.py), with an API key; a HOME of its own for the client and nothing set
# by hand. Proof: the client's exit 0 and reply, the engine's log counting the request, the
# front's queue in `status --json`. Under 200 s; leaves no process.
#   bash benchmarks/device/device_opencode.sh   (writes $OUT/opencode.json)
set -uo pipefail
source benchmarks/device/device_env.sh
OUT=${OUT:-/tmp/opencode-out}
W=$PWD/.devrun/work/opencode
mkdir -p "$OUT" "$W/home" "$W/project" .devrun/oc/bin
PORT=18310
KEY=device-opencode-$RANDOM$RANDOM
SERVE_PID=
finish() {
    [ -n "$SERVE_PID" ] && { lucebox down > /dev/null 2>&1; kill -KILL "$SERVE_PID" 2> /dev/null; }
    python3 -c "
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.machine import config
import os
config.reset_config(resolve_paths(dict(os.environ)))
" > /dev/null 2>&1
    return 0
}
trap finish EXIT
[ -x .devrun/oc/bin/opencode ] || { xz -dc .devrun/oc/opencode.xz > .devrun/oc/bin/opencode.part &&
    chmod +x .devrun/oc/bin/opencode.part && mv .devrun/oc/bin/opencode.part .devrun/oc/bin/opencode; } || exit 1
M=.devrun/work/models
[ -f "$M/qwen35-tiny-dflash.gguf" ] || python3 benchmarks/lucebox_models.py "$M" pair > /dev/null || exit 1
python3 -c "
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.machine import config
import os
paths = resolve_paths(dict(os.environ))
config.set_setting(paths, 'server.api_key', '$KEY')
config.set_setting(paths, 'spec.calibrate_idle_s', '0')
" || exit 1
# OpenCode's own system prompt and tools take about 10K tokens: 32K of context holds them and
# its reply.
lucebox serve --model "$M/qwen35-tiny.gguf" --draft "$M/qwen35-tiny-dflash.gguf" --engine lucebox \
    --ctx 32768 --port "$PORT" > "$W/serve.log" 2>&1 &
SERVE_PID=$!
state=$(wait_serve_ready "$SERVE_PID")
echo "serve state: $state"
before=$(grep -c "chat DONE" "$LUCEBOX_HOME/state/logs/engine.log" 2> /dev/null || echo 0)
started=$(date +%s.%N)
PY=$(command -v python3); OC_BIN=$(cd .devrun/oc/bin && pwd)
(cd "$W/project" && env -i PATH="$OC_BIN:/usr/bin:/bin" HOME="$PWD/../home" \
    LUCEBOX_HOME="$LUCEBOX_HOME" PYTHONPATH="$PYTHONPATH" \
    timeout 150 "$PY" -m lucebox.app.cli launch opencode -- run "Reply with one word: hello" \
    > "$W/client.out" 2> "$W/client.err")
rc=$?
elapsed=$(python3 -c "import time; print(round(time.time() - $started, 1))")
after=$(grep -c "chat DONE" "$LUCEBOX_HOME/state/logs/engine.log" 2> /dev/null || echo 0)
lucebox status --json > "$W/status.json" 2> /dev/null
echo "opencode rc $rc in $elapsed s; engine replies $before -> $after"
tail -c 600 "$W/client.out"; echo; tail -c 1500 "$W/client.err"; echo
python3 - "$W" "$OUT/opencode.json" "$state" "$rc" "$elapsed" "$before" "$after" <<'PY'
import json, sys
from pathlib import Path
w, out = Path(sys.argv[1]), Path(sys.argv[2])
state, rc, elapsed, before, after = sys.argv[3:8]
try:
    status = json.loads((w / "status.json").read_text())
except (OSError, ValueError) as exc:
    status = {"error": str(exc)}
doc = {"client": "opencode-ai 1.18.33 (linux-x64 binary)", "way": "lucebox launch opencode -- run",
       "serve_state": state, "client_exit": int(rc), "client_s": float(elapsed),
       "engine_replies": [int(before), int(after)],
       "client_stdout_tail": (w / "client.out").read_text(errors="replace")[-1500:],
       "client_stderr_tail": (w / "client.err").read_text(errors="replace")[-3000:],
       "queue": status.get("queue"), "engine": status.get("engine"),
       "serve_log_tail": (w / "serve.log").read_text(errors="replace")[-2000:]}
out.write_text(json.dumps(doc, indent=1))
print("queue:", doc["queue"])
PY
