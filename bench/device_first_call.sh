#!/usr/bin/env bash
# A lease's first call, under 590 s: both engines built by lucebox side by side
# (bench/device_session.sh start; BSA=0 by default here), the vision run once llama.cpp's build
# is in (bench/device_vision.sh), the Lucebox build's memory fit once it is in
# (bench/device_lucebox_fit.sh), then both engines packed into $OUT for a later lease.
# Everything but the packed engines comes back in $OUT/first-call.tgz (the device returns at
# most 8 files).   BSA=0 bash bench/device_first_call.sh
set -uo pipefail
export BSA=${BSA:-0} PIP_NO_INDEX=1
start=$(date +%s)
END=$((start + ${CALL_S:-585}))
R=/tmp/first-call
mkdir -p "$R"
source bench/device_env.sh
H=$LUCEBOX_HOME
bash bench/device_session.sh start > "$R/session-start.txt" 2>&1
until [ -f "$H/build-llama.rc" ] || [ "$(date +%s)" -gt $((END - 150)) ]; do sleep 2; done
echo "llama.cpp build: rc $(cat "$H/build-llama.rc" 2>/dev/null) at $(($(date +%s) - start)) s"
if [ "$(cat "$H/build-llama.rc" 2>/dev/null)" = 0 ]; then
    mkdir -p "$R/vision" && OUT=$R/vision timeout 200 bash bench/device_vision.sh > "$R/vision.txt" 2>&1
    echo "vision done at $(($(date +%s) - start)) s"
fi
until [ -f "$H/build-lucebox.rc" ] || [ "$(date +%s)" -gt $((END - 60)) ]; do sleep 2; done
echo "lucebox build: rc $(cat "$H/build-lucebox.rc" 2>/dev/null) at $(($(date +%s) - start)) s"
if [ "$(cat "$H/build-lucebox.rc" 2>/dev/null)" = 0 ]; then
    mkdir -p "$R/fit" && OUT=$R/fit DEADLINE=$((END - 45)) bash bench/device_lucebox_fit.sh \
        > "$R/fit.txt" 2>&1
    echo "fit done at $(($(date +%s) - start)) s"
fi
WAIT_S=1 PACK=${PACK:-1} OUT=$R bash bench/device_session.sh wait > "$R/pack.txt" 2>&1
mv "$R"/engines.tar.xz.part* "$OUT/" 2>/dev/null
tar -czf "$OUT/first-call.tgz" -C "$R" .
tail -n 12 "$R/vision.txt" 2>/dev/null
grep -h '"name"' "$R"/fit/*.jsonl 2>/dev/null | cut -c1-400
cat "$R/pack.txt" | grep -E "^==|engines" | head
ls -la "$OUT"
echo "first call done in $(($(date +%s) - start)) s"
