"""Device benchmark: a GPU and a loopback `lucebox worker` on the same GPU as two devices.

Starts `lucebox worker --gpu 0` (the engine's ggml-rpc-server on 127.0.0.1), plans and serves a
generated model with `--rpc` to it, sends requests, then reads each process's memory from
nvidia-smi: ggml-rpc-server holds the peer's share of the plan, llama-server the local GPU's.
A device passes when its memory is within 5% of its share (`plan --json` devices). One JSON
line; the worker and its RPC server are stopped at the end (and checked gone).

    python -m benchmarks.rpc_peer_vs_gpu --work .devrun/work
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from benchmarks.launch_matches_plan_gpu import (
    LLAMA_3B,
    PROMPTS,
    ask,
    engine_mib,
    lucebox,
    model,
    wait_ready,
)

SERVE_PORT = 18290
RPC_PORT = 50052
TOLERANCE_PERCENT = 5.0


def start_worker(log: Path) -> tuple[subprocess.Popen[str], psutil.Process]:
    """The worker, once it says ready, and its RPC server (its one child)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "lucebox.app.cli", "worker", "--port", str(RPC_PORT), "--gpu", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    with log.open("w") as out:
        for line in proc.stdout:
            out.write(line)
            if line.startswith("worker ready"):
                break
    if proc.poll() is not None:
        raise SystemExit(f"the worker did not start: see {log}")
    (server,) = [c for c in psutil.Process(proc.pid).children() if "rpc-server" in c.name()]
    return proc, server


def compare(plan: dict, engine_pid: int, rpc_pid: int) -> list[dict]:
    """Each planned device (peer first, as the engine orders them) against its process."""
    pids = {"peer": rpc_pid, "GPU": engine_pid}
    rows = []
    for device in plan["devices"]:
        kind = "peer" if device["name"].startswith("peer ") else "GPU"
        used = engine_mib(pids[kind])
        planned = device["memory_bytes"] / 2**20
        rows.append(
            {
                "device": device["name"],
                "process": "ggml-rpc-server" if kind == "peer" else "llama-server",
                "planned_mib": round(planned),
                "used_mib": used,
                "difference_percent": round(100 * (used - planned) / used, 2) if used else None,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, default=Path(".devrun/work"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    target = model(args.work, "llama-3b", LLAMA_3B)
    options = ["--model", str(target), "--spec", "off", "--allow-base"]
    options += ["--rpc", f"127.0.0.1:{RPC_PORT}"]
    result: dict = {"case": "gpu+loopback-worker"}
    worker, rpc_server = start_worker(args.work / "worker.out")
    try:
        planned = lucebox("plan", *options, "--json")
        plan = json.loads(planned.stdout) if planned.stdout else {}
        result |= {
            "plan_rc": planned.returncode,
            "plan_devices": plan.get("devices"),
            "tensor_split": plan.get("tensor_split"),
            "argv": plan.get("argv"),
        }
        if planned.returncode != 0:
            result["error"] = planned.stderr.strip()[-400:]
            return
        log = (args.work / "rpc.serve.log").open("w")
        serve = subprocess.Popen(
            [sys.executable, "-m", "lucebox.app.cli", "serve", *options, "--port", str(SERVE_PORT)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            status = wait_ready(time.monotonic() + 300)
            result |= {"state": status.get("state"), "restarts": status.get("restarts")}
            if status.get("state") != "ready":
                return
            replies = [ask(status["url"], p) for p in PROMPTS]
            result["completion_tokens"] = sum(r["usage"]["completion_tokens"] for r in replies)
            rows = compare(plan, int(status["engine_pid"]), rpc_server.pid)
            result["devices"] = rows
            result["pass"] = all(
                r["difference_percent"] is not None
                and abs(r["difference_percent"]) <= TOLERANCE_PERCENT
                for r in rows
            )
        finally:
            serve.send_signal(signal.SIGTERM)
            serve.wait(timeout=60)
    finally:
        worker.send_signal(signal.SIGTERM)
        result["worker_rc"] = worker.wait(timeout=60)
        result["rpc_server_left"] = rpc_server.is_running() and rpc_server.status() != "zombie"
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
