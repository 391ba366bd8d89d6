#!/usr/bin/env bash
# A lease's first call, under 590 s: both engines built by lucebox side by side
# (benchmarks/device/device_session.sh start; BSA=0 by default here), the vision run once llama.cpp's build
# is in (benchmarks/device/device_vision.sh), the Lucebox build's memory fit once it is in
# (benchmarks/device/device_lucebox_fit.sh), then both engines packed into $OUT for a later lease.
# Everything but the packed engines comes back in $OUT/first-call.tgz (the device returns at
# most 8 files). AFTER_LLAMA / AFTER_LUCEBOX name other benchmarks/device_*.sh steps (empty: none);
# OLD_BUILD=1 then starts the Lucebox engine 62880e20's build detached, for a later call's
# update run (benchmarks/device/device_engine_update.sh finds it installed).
#   BSA=0 bash benchmarks/device/device_first_call.sh
set -uo pipefail
export BSA=${BSA:-0} PIP_NO_INDEX=1
start=$(date +%s)
END=$((start + ${CALL_S:-585}))
R=/tmp/first-call
mkdir -p "$R"
source benchmarks/device/device_env.sh
H=$LUCEBOX_HOME
bash benchmarks/device/device_session.sh start > "$R/session-start.txt" 2>&1
until [ -f "$H/build-llama.rc" ] || [ "$(date +%s)" -gt $((END - 150)) ]; do sleep 2; done
echo "llama.cpp build: rc $(cat "$H/build-llama.rc" 2>/dev/null) at $(($(date +%s) - start)) s"
AFTER_LLAMA=${AFTER_LLAMA-device_vision.sh}
if [ "$(cat "$H/build-llama.rc" 2>/dev/null)" = 0 ] && [ -n "$AFTER_LLAMA" ]; then
    mkdir -p "$R/after-llama" && OUT=$R/after-llama timeout 200 bash "benchmarks/device/$AFTER_LLAMA" > "$R/after-llama.txt" 2>&1
    echo "$AFTER_LLAMA done at $(($(date +%s) - start)) s"
fi
until [ -f "$H/build-lucebox.rc" ] || [ "$(date +%s)" -gt $((END - 60)) ]; do sleep 2; done
echo "lucebox build: rc $(cat "$H/build-lucebox.rc" 2>/dev/null) at $(($(date +%s) - start)) s"
AFTER_LUCEBOX=${AFTER_LUCEBOX-device_lucebox_fit.sh}
if [ "$(cat "$H/build-lucebox.rc" 2>/dev/null)" = 0 ] && [ "${OLD_BUILD:-0}" = 1 ]; then
    setsid nohup bash -c "
        s=\$(date +%s)
        python3 -m lucebox.app.cli engine source --engine lucebox --version 62880e20 \
            --tarball $PWD/.devrun/carry/lucebox-62880e20-server.tar.gz > $H/build-old.log 2>&1 &&
        python3 -m lucebox.app.cli engine build --engine lucebox --version 62880e20 --json \
            > $H/build-old.json 2>> $H/build-old.log
        rc=\$?; echo \$(( \$(date +%s) - s )) > $H/build-old.seconds; echo \$rc > $H/build-old.rc
    " > /dev/null 2>&1 < /dev/null &
    echo "62880e20 build started at $(($(date +%s) - start)) s"
fi
if [ "$(cat "$H/build-lucebox.rc" 2>/dev/null)" = 0 ] && [ -n "$AFTER_LUCEBOX" ]; then
    mkdir -p "$R/after-lucebox" && OUT=$R/after-lucebox DEADLINE=$((END - 45)) \
        timeout $((END - 45 - $(date +%s))) bash "benchmarks/device/$AFTER_LUCEBOX" > "$R/after-lucebox.txt" 2>&1
    echo "$AFTER_LUCEBOX done at $(($(date +%s) - start)) s"
fi
WAIT_S=1 PACK=${PACK:-1} OUT=$R bash benchmarks/device/device_session.sh wait > "$R/pack.txt" 2>&1
mv "$R"/engines.tar.xz.part* "$OUT/" 2>/dev/null
tar -czf "$OUT/first-call.tgz" -C "$R" .
tail -n 12 "$R/after-llama.txt" 2>/dev/null
tail -n 40 "$R/after-lucebox.txt" 2>/dev/null
cat "$R/pack.txt" | grep -E "^==|engines" | head
ls -la "$OUT"
echo "first call done in $(($(date +%s) - start)) s"
