#!/usr/bin/env bash
# Device run for vision (issue 44): a generated llama text model with its generated SigLIP-shaped
# projector (896 px, F16) through `lucebox serve --vision on` on the GPU, then --vision off:
# the plan's projector terms and total against nvidia-smi of the engine process after warm-up,
# an image request through the OpenAI API and its TTFT from `status --json`.
# Results: $OUT/vision.json and $OUT/results/gpu-vision.json (for benchmarks/results/). ~100 s.
set -uo pipefail
source benchmarks/device/device_env.sh
ensure_engine > "$OUT/engine.txt" 2>&1
timeout 200 python3 -m benchmarks.vision_on_gpu --work .devrun/work/vision \
    --out "$OUT/vision.json" --out "$OUT/results/gpu-vision.json" > "$OUT/vision.out" 2>&1
echo "driver exit: $?"
lucebox down > /dev/null 2>&1
cp .devrun/work/vision/serve-*.log "$OUT/" 2>/dev/null
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
