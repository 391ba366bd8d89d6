"""Benchmark: what `lucebox serve` adds to the engine it supervises.

1. Ready time: `lucebox serve --preset smoke` from launch to /health 200, against starting the
   same llama-server argv (read from the engine log) by hand, in one run.
2. Sampler cost: CPU time of the lucebox process over --idle-s seconds at 1 Hz sampling.
3. Decode speed: the median `predicted_per_second` of a fixed request served by lucebox
   (sampler on) and by the bare engine (no sampler).

Uses the built CPU engine and the Gemma 3 270M from the test cache (support/realmodels.py), or
with --model the given GGUF and the engine installed in $LUCEBOX_HOME
(`drive.sh serve_overhead` runs it on the GPU with a generated 8B llama). The file is read
once first, so that neither
start pays for a cold page cache.

    .venv/bin/python -m benchmarks.serve_overhead [--idle-s 60] [--requests 5] [--model PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import time
from pathlib import Path

import httpx
import psutil

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.run.runstate import engine_log
from support.ports import free_port
from support.realmodels import engine_home, gemma_model, smoke_serve_argv

REQUEST = {
    "messages": [{"role": "user", "content": "Write a short story about a lighthouse."}],
    "max_tokens": 128,
    "temperature": 0,
    "seed": 1,
}


def serve_argv(port: int, model: Path | None) -> list[str]:
    """`lucebox serve` of the smoke preset, or of ``model`` at the context the plan picks."""
    argv = smoke_serve_argv(port)
    if model is not None:
        argv[argv.index("--preset") : argv.index("--preset") + 2] = ["--model", str(model)]
        argv[argv.index("--ctx") : argv.index("--ctx") + 2] = []
    return argv


def serve_env(model: Path | None) -> dict[str, str]:
    """The smoke preset's engine and Gemma from the test cache, or for ``model`` the engine in
    $LUCEBOX_HOME with the file read once, so that no start pays for a cold page cache."""
    if model is None:
        gemma_model()
        return {**os.environ, "LUCEBOX_HOME": str(engine_home())}
    with model.open("rb") as handle:
        while handle.read(2**24):
            pass
    return dict(os.environ)


def wait_ready(port: int, started: float, timeout_s: float = 300) -> float:
    while time.monotonic() - started < timeout_s:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    raise SystemExit("the server did not become ready")


def decode_speeds(port: int, count: int) -> list[float]:
    speeds = []
    for _ in range(count):
        reply = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions", json=REQUEST, timeout=300
        ).json()
        speeds.append(reply["timings"]["predicted_per_second"])
    return speeds


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--idle-s", type=float, default=60)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--model", type=Path, help="a GGUF to serve instead of the smoke preset")
    args = parser.parse_args()
    env = serve_env(args.model)
    port = free_port()
    argv = serve_argv(port, args.model)
    started = time.monotonic()
    served = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    lucebox_ready_s = wait_ready(port, started)
    lucebox_process = psutil.Process(served.pid)
    cpu_before = lucebox_process.cpu_times()
    time.sleep(args.idle_s)
    cpu_after = lucebox_process.cpu_times()
    idle_cpu_s = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
    with_sampler = decode_speeds(port, args.requests)
    log = engine_log(resolve_paths(env))
    starts = [
        line for line in log.read_text().splitlines() if line.startswith("# lucebox: starting ")
    ]
    argv = shlex.split(starts[-1].removeprefix("# lucebox: starting "))
    stop(served)

    by_hand_port = free_port()
    argv[argv.index("--port") + 1] = str(by_hand_port)
    started = time.monotonic()
    bare = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    by_hand_ready_s = wait_ready(by_hand_port, started)
    bare_speeds = decode_speeds(by_hand_port, args.requests)
    stop(bare)
    print(
        json.dumps(
            {
                "model": str(args.model or "smoke preset"),
                "lucebox_ready_s": round(lucebox_ready_s, 2),
                "by_hand_ready_s": round(by_hand_ready_s, 2),
                "ready_ratio": round(lucebox_ready_s / by_hand_ready_s, 2),
                "sampler_idle_cpu_percent_of_a_core": round(100 * idle_cpu_s / args.idle_s, 2),
                "decode_tok_s_with_sampler": round(statistics.median(with_sampler), 1),
                "decode_tok_s_bare": round(statistics.median(bare_speeds), 1),
                "decode_ratio": round(
                    statistics.median(with_sampler) / statistics.median(bare_speeds), 3
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
