#!/usr/bin/env bash
# Device run: on the GPU machine, with its system CUDA toolkit hidden, `lucebox engine build`
# fetches the pinned CUDA 13.0 wheels, builds the CUDA engine for the card it finds and serves a
# generated model on the GPU with it; then the speculation break-even of each mode on that
# engine (what specguard.CUDA_BREAK_EVEN holds). The machine has no network: the wheels come in pieces of at most 61 MiB
# (a call carries 64 MiB), one piece per call, gathered in /tmp/xfer while the machine stays
# warm (`--gather`), and pip reads them with PIP_FIND_LINKS, checking the pinned hashes as it
# does from the package index. The pieces are made here with
#     tar cf - nvidia_*.whl SHA256SUMS | split -b 61M -d -a 1 - part   (one .xferN/partN each)
#
#     bash benchmarks/device/device_toolkit.sh --gather      # each call but the last (carry .xferN)
#     bash benchmarks/device/device_toolkit.sh --build       # carry .whl and the last piece
#     bash benchmarks/device/device_toolkit.sh --measure     # serve on the GPU, break-even per mode
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
step=${1:?"--gather, --build or --measure"}
mkdir -p /tmp/xfer
cp .xfer*/part* /tmp/xfer/ 2>/dev/null
echo "pieces here: $(find /tmp/xfer -name 'part*' -printf '%f ')($(du -sm /tmp/xfer | cut -f1) MiB)"
[ "$step" = --gather ] && exit 0

if [ -z "${LUCEBOX_BENCH_HIDDEN:-}" ]; then
    if [ ! -f /tmp/wheels/SHA256SUMS ]; then
        mkdir -p /tmp/wheels
        cat /tmp/xfer/part* | tar x -C /tmp/wheels || exit 1
        (cd /tmp/wheels && sha256sum -c --quiet SHA256SUMS) || exit 1
    fi
    cp "$(command -v cuobjdump)" /tmp/cuobjdump 2>/dev/null
    exec unshare -m env LUCEBOX_BENCH_HIDDEN=1 bash "$0" "$@"
fi
[ -d /usr/local/cuda ] && { mount --bind "$(mktemp -d)" /usr/local/cuda || exit 1; }
PATH=$(tr ':' '\n' <<<"$PATH" | grep -v -i cuda | paste -sd:)
unset CUDA_HOME CUDA_PATH
if nvcc --version >/dev/null 2>&1; then
    echo "nvcc still runs: $(command -v nvcc)" >&2
    exit 1
fi
export PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/wheels
source benchmarks/device/device_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

if [ "$step" = --build ]; then
    lucebox engine source --sdist "$ENGINE_SDIST" || exit 1
    start=$(date +%s)
    timeout 540 python3 -m lucebox.app.cli engine build --json >"$OUT/build.json" 2> >(
        while IFS= read -r line; do echo "$(($(date +%s) - start)) $line"; done | tee "$OUT/build.log" >&2
    )
    echo "engine build rc=$? in $(($(date +%s) - start)) s"
    sleep 1
    lucebox engine status --json | tee "$OUT/engine-status.json"
    cat .devrun/home/cache/toolkits/*/.lucebox-toolkit.json
    du -sh .devrun/home/cache/toolkits/*/
    server=$(lucebox engine path) || exit 1
    /tmp/cuobjdump --list-elf "$server" >"$OUT/elf.txt"
    echo "cuobjdump: $(wc -l <"$OUT/elf.txt") ELF images, $(grep -c sm_90 "$OUT/elf.txt") for sm_90"
    ls -la "$(dirname "$server")"
    readelf -d "$server" | grep -E "NEEDED|RUNPATH|RPATH"
    exit 0
fi

# --measure: what `lucebox serve` starts on the GPU with this engine, against its plan, then
# the break-even acceptance of each speculation mode (wall time: the basis on a GPU).
python3 -m benchmarks.launch_matches_plan_gpu --work .devrun/work --case mtp:16384 | tee "$OUT/launch_vs_gpu.jsonl"
server=$(lucebox engine path) || exit 1
timeout 200 python3 -m benchmarks.spec_breakeven --server "$server" --threads 4 --json \
    | tee "$OUT/breakeven-small.json"
timeout 240 python3 -m benchmarks.spec_breakeven --server "$server" --threads 4 --json \
    --scale 32 --layers 16 --quant F16 | tee "$OUT/breakeven-large.json"
exit 0
