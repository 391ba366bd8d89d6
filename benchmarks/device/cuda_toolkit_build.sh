#!/usr/bin/env bash
# Bench (issue 21): a CUDA engine for sm_86 on a machine that has no CUDA toolkit, with the
# toolkit fetched from PyPI by `lucebox engine build`. It hides the system toolkit (a private
# mount namespace over /usr/local/cuda; PATH, CUDA_HOME and CUDA_PATH cleaned), builds into a
# fresh LUCEBOX_HOME, lists the kernels with cuobjdump from NVIDIA's wheel, and prints the
# download size, the toolkit fetch time and the build time. Needs root (for the bind mount).
#
#     nice -n 19 benchmarks/device/cuda_toolkit_build.sh [LUCEBOX_HOME]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ -z "${LUCEBOX_BENCH_HIDDEN:-}" ]; then
    exec unshare -m env LUCEBOX_BENCH_HIDDEN=1 "$0" "$@"
fi
if [ -d /usr/local/cuda ]; then
    mount --bind "$(mktemp -d)" /usr/local/cuda || exit 1
fi
PATH=$(tr ':' '\n' <<<"$PATH" | grep -v -i cuda | paste -sd:)
unset CUDA_HOME CUDA_PATH
# A wrapper script may stay on PATH (this machine has /usr/local/bin/nvcc); it must not run.
if nvcc --version >/dev/null 2>&1; then
    echo "nvcc still runs: $(command -v nvcc)" >&2
    exit 1
fi
home=${1:-$(mktemp -d /tmp/lucebox-cuda-bench.XXXXXX)}
mkdir -p "$home"
export LUCEBOX_HOME=$home PYTHONUNBUFFERED=1
py=$PWD/.venv/bin/python
lucebox() { "$py" -m lucebox.app.cli "$@"; }
echo "LUCEBOX_HOME=$home"
lucebox engine source || exit 1
start=$(date +%s)
# Each stderr line gets the seconds since the start, so the fetch and the compile can be told apart.
lucebox engine build --cuda --arch 86 --json >"$home/build.json" 2> >(
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
lucebox engine status --json | tee "$home/status.json"
server=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["server_path"])' "$home/build.json") || exit 1
"$py" -m pip install -q --no-deps --target "$home/cuobjdump" nvidia-cuda-cuobjdump==13.2.51 || exit 1
"$home"/cuobjdump/nvidia/cu13/bin/cuobjdump --list-elf "$server" >"$home/elf.txt"
echo "cuobjdump: $(wc -l <"$home/elf.txt") ELF images, $(grep -c sm_86 "$home/elf.txt") for sm_86," \
    "$(grep -v -c sm_86 "$home/elf.txt") for other archs"
ls -la "$(dirname "$server")"
readelf -d "$server" | grep -E "NEEDED|RUNPATH|RPATH"
