#!/usr/bin/env bash
# Device run for the Lucebox engine (dflash_server), in two calls chained while the machine
# stays warm (LUCEBOX_HOME in .devrun/27home, which the second call finds):
#   build    `lucebox engine source --engine lucebox --tarball` + `lucebox engine build --engine
#            lucebox` in its own session (it outlives a call that ends first), waited for,
#            then the engine folder packed into $OUT (to carry to a later machine).
#   measure  the engine's --help; generated qwen35 target + Lucebox-format draft (benchmarks/lucebox_models.py); the raw
#            engine served plain, DFlash chain, DDTree (greedy, sampled, sampled-verify),
#            KVFlash at 4x its pool, PFlash on a long prompt, the MTP target's load; each with
#            its log, usage JSON, /status/json, /props and nvidia-smi after warm-up; then
#            `lucebox serve --engine lucebox` end to end. Everything lands in $OUT/measure.tgz.
#   restore  a later machine: unpack the engine carried in .devrun/27/engine.tar.xz.part*.
# Run from the repo root with wheels in .devrun/27/whl and the pinned tarball at
# .devrun/27/lucebox.tar.gz (carry .devrun/27). A finished build is packed into $OUT as
# engine.tar.xz.partN: carried back in .devrun/27, `restore` installs it on a fresh machine.
set -uo pipefail
ROOT=$PWD
D=$ROOT/.devrun/27
export LUCEBOX_HOME=$ROOT/.devrun/27home PYTHONUNBUFFERED=1
export PIP_NO_INDEX=1 PIP_FIND_LINKS=$D/whl
mkdir -p "$LUCEBOX_HOME"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$D"/whl/*.whl 2>/dev/null || exit 1
mkdir -p .typecheck/lucebox
for part in app engine presets; do ln -sfn "../../$part" ".typecheck/lucebox/$part"; done
export PYTHONPATH=/tmp/site:$PWD/.typecheck:$PWD
lucebox() { python3 -m lucebox.app.cli "$@"; }
H=$LUCEBOX_HOME

pack_engine() {  # the installed engine folder, in pieces small enough to come back from $OUT
    local manifest
    manifest=$(ls "$H"/data/engines/lucebox-*/manifest.json | head -1)
    (cd "$(dirname "$(dirname "$manifest")")" && tar -cf - "$(basename "$(dirname "$manifest")")" \
        | xz -T0 -6 | split -b 15M -d -a 1 - "$OUT/engine.tar.xz.part")
    ls -la "$OUT"
}

wait_build() {  # seconds
    for _ in $(seq 1 "$1"); do [ -f "$H/build.rc" ] && return 0; sleep 1; done
    return 1
}

case "${1:-}" in
build)
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv
    nvcc --version | tail -2
    rm -f "$H/build.rc"
    setsid nohup bash -c "
        start=\$(date +%s)
        python3 -m lucebox.app.cli engine source --engine lucebox --tarball $D/lucebox.tar.gz --json \
            > $H/source.json 2> $H/source.err &&
        python3 -m lucebox.app.cli engine build --engine lucebox --json > $H/build.json 2> $H/build.err
        rc=\$?; echo \$(( \$(date +%s) - start )) > $H/build.seconds; echo \$rc > $H/build.rc
    " > /dev/null 2>&1 < /dev/null &
    wait_build 555 || echo "build still running after 555 s"
    cat "$H/source.json" "$H/source.err" 2>/dev/null | tail -12
    tail -c 3000 "$H/build.err" 2>/dev/null
    cat "$H/build.rc" "$H/build.seconds" 2>/dev/null
    [ "$(cat "$H/build.rc" 2>/dev/null)" = 0 ] && pack_engine
    ;;
restore)
    mkdir -p "$H/data/engines"
    cat "$D"/engine.tar.xz.part* | xz -d | tar -x -C "$H/data/engines" || exit 1
    ls "$H/data/engines"
    ;;
measure)
    if ! ls "$H"/data/engines/lucebox-*/manifest.json > /dev/null 2>&1; then
        wait_build 300 || { echo "the build did not finish"; tail -c 2000 "$H/build.err"; exit 1; }
        echo "build rc $(cat "$H/build.rc") in $(cat "$H/build.seconds") s"
    fi
    bash "$ROOT/bench/device_lucebox_measure.sh" 2>&1 | tee "$H/measure.out"
    ;;
*)
    echo "usage: device_lucebox.sh build|measure|restore" >&2
    exit 2
    ;;
esac
