"""Device benchmark: planned VRAM vs what the GPU shows, and planned vs largest loadable context.

For each model: occupy VRAM with another process so that --leave-free-mib remain (a smaller
card, as NVML reports it to the planner), run `lucebox plan --model M --json`, start
llama-server with exactly the planned argv, send one request, read the server's VRAM from
nvidia-smi, then bisect the largest context that loads and serves with the same flags
(steps of 2048, then of 256 within the last one). Prints one JSON line per model. Needs a
CUDA engine (`lucebox engine build`) and torch.

    python -m benchmarks.plan_memory_vs_gpu --model llama8b:24576 --model gemma3-4b:12288 ...
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from support.ggufgen import SHAPES, write_gguf

PORT = 18180


def lucebox(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lucebox.app.cli", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def free_mib() -> int:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out.split()[0])


def hog(leave_free_mib: int) -> subprocess.Popen[str] | None:
    """Hold VRAM in another process so that about leave_free_mib stay free."""
    take = free_mib() - leave_free_mib
    if take <= 0:
        return None
    code = (
        "import torch, sys, time\n"
        f"x = torch.empty({take} * 2**20, dtype=torch.uint8, device='cuda')\n"
        "print('held', flush=True)\ntime.sleep(3600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.readline()
    time.sleep(1)
    return proc


def serve(argv: list[str], log: Path) -> tuple[bool, int | None, str]:
    """Start the server, wait for it, send one request; returns (served, VRAM MiB, log)."""
    with log.open("w") as handle:
        proc = subprocess.Popen(
            [*argv, "--port", str(PORT), "-lv", "4"], stdout=handle, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{PORT}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        if proc.poll() is not None:
            return False, None, log.read_text(errors="replace")
        try:
            reply = httpx.post(
                f"http://127.0.0.1:{PORT}/v1/chat/completions",
                timeout=120,
                json={"messages": [{"role": "user", "content": "hello"}], "max_tokens": 16},
            )
        except httpx.HTTPError:
            return False, None, log.read_text(errors="replace")  # died serving: does not fit
        if reply.status_code != 200:
            return False, None, log.read_text(errors="replace")
        apps = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        used = next(
            (
                int(line.split(",")[1])
                for line in apps.splitlines()
                if line.split(",")[0].strip() == str(proc.pid)
            ),
            None,
        )
        return True, used, log.read_text(errors="replace")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def buffers(log_text: str) -> dict[str, float]:
    """The engine's own buffer sizes from its -lv 4 log (MiB)."""
    found: dict[str, float] = {}
    for label, pattern in [
        ("model", r"CUDA0 model buffer size =\s*([\d.]+)"),
        ("kv", r"CUDA0 KV buffer size =\s*([\d.]+)"),
        ("compute", r"CUDA0 compute buffer size =\s*([\d.]+)"),
    ]:
        values = [float(v) for v in re.findall(pattern, log_text)]
        if values:
            found[label] = sum(values)
    return found


def with_ctx(argv: list[str], ctx: int) -> list[str]:
    out = list(argv)
    out[out.index("-c") + 1] = str(ctx)
    return out


def largest_loading(argv: list[str], low: int, high: int, step: int, log: Path) -> int:
    """Bisect the largest multiple of ``step`` in [low, high] that loads and serves
    (``low`` is known to)."""
    lo, hi = low // step, high // step
    while lo < hi:
        mid = (lo + hi + 1) // 2
        served, _, _ = serve(with_ctx(argv, mid * step), log)
        if served:
            lo = mid
        else:
            hi = mid - 1
    return max(low, lo * step)


def measure(name: str, leave_free_mib: int, work: Path) -> dict[str, object]:
    model = work / f"{name}.gguf"
    if not model.exists():
        write_gguf(model, SHAPES[name])
    holder = hog(leave_free_mib)
    try:
        planned = lucebox("plan", "--model", str(model), "--json")
        plan = json.loads(planned.stdout)
        argv = [a if a != "<model>" else str(model) for a in plan["argv"]]
        ok, used_mib, log_text = serve(argv, work / f"{name}-planned.log")
        planned_mib = (plan["memory_bytes"]["total"]) / 2**20
        low, high = plan["ctx"], SHAPES[name].n_ctx
        if not ok:
            low = 0
        coarse = largest_loading(argv, low, high, 2048, work / f"{name}-probe.log")
        best = max(low, coarse)
        # Then in the planner's own 256-token steps within the last coarse step.
        probe_log = work / f"{name}-probe.log"
        best = largest_loading(argv, best, min(best + 2048 - 256, high), 256, probe_log)
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
    return {
        "model": name,
        "free_mib_for_plan": leave_free_mib,
        "planned_ctx": plan["ctx"],
        "kv_type": plan["cache_type_k"],
        "planned_fits": plan["fits"],
        "served_at_plan": ok,
        "planned_vram_mib": round(planned_mib),
        "measured_vram_mib": used_mib,
        "vram_ratio": round(used_mib / planned_mib, 3) if used_mib else None,
        "largest_ctx_that_loads": best,
        "ctx_ratio": round(plan["ctx"] / best, 3) if best else None,
        "engine_buffers_mib": buffers(log_text),
        "plan_memory_mib": {k: round(v / 2**20) for k, v in plan["memory_bytes"].items()},
        "fit_check": plan.get("fit_check"),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--model",
        action="append",
        required=True,
        help="NAME:LEAVE_FREE_MIB, NAME one of " + ", ".join(SHAPES),
    )
    parser.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")))
    args = parser.parse_args()
    for item in args.model:
        name, _, leave = item.partition(":")
        print(json.dumps(measure(name, int(leave), args.work)), flush=True)


if __name__ == "__main__":
    main()
