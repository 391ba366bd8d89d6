"""Device benchmark: what `lucebox serve` launches against what its plan said, on a real GPU.

For each case: hold VRAM in another process so that about --leave-free-mib stay free, print
the plan (`lucebox plan ... --json`), start `lucebox serve` with the same options, wait until
it is ready, send requests, then read the engine's memory from nvidia-smi and the speculation
counters from `lucebox status --json`. A case passes when the engine started without an
out-of-memory restart and its memory is within 5% of the plan's total. One JSON line per case.

    python -m benchmarks.launch_matches_plan_gpu --case pair:16384 --case ngram:16384 ...
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.plan_memory_vs_gpu import free_mib, hog
from support.ggufgen import (
    ModelSpec,
    dflash_for,
    qwen3_pair,
    qwen35_target,
    widen,
    write_gguf,
)

PORT = 18280
LLAMA_3B = ModelSpec(
    name="Random Llama 3B Instruct",
    n_layer=28,
    n_embd=3072,
    n_head=24,
    n_head_kv=8,
    n_ff=8192,
    vocab_size=128256,
    n_ctx=131072,
    constant_weights=True,
)
LLAMA_1B_DRAFT = ModelSpec(
    name="Random Llama 1B Instruct",
    n_layer=16,
    n_embd=2048,
    n_head=32,
    n_head_kv=8,
    n_ff=8192,
    vocab_size=128256,
    n_ctx=131072,
    constant_weights=True,
)


@dataclass(frozen=True)
class Case:
    name: str
    target: Path
    draft: Path | None
    spec: str


def lucebox(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lucebox.app.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout_s,
    )


def engine_mib(pid: int) -> int | None:
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid):
            return int(fields[1])
    return None


def wait_ready(deadline_s: float) -> dict:
    status: dict = {}
    while time.monotonic() < deadline_s:
        done = lucebox("status", "--json")
        if done.returncode == 0:
            status = json.loads(done.stdout)
            if status.get("state") in ("ready", "failed"):
                return status
        time.sleep(1)
    return status


def ask(url: str, prompt: str, n: int = 96) -> dict:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": n}
    with httpx.Client(timeout=120) as client:
        reply = client.post(f"{url}/v1/chat/completions", json=body)
        reply.raise_for_status()
        return reply.json()


def run_case(case: Case, leave_free_mib: int, work: Path) -> dict:
    holder = hog(leave_free_mib)
    options = ["--model", str(case.target), "--spec", case.spec, "--allow-base"]
    if case.draft is not None:
        options += ["--draft", str(case.draft)]
    result: dict = {"case": case.name, "leave_free_mib": leave_free_mib, "free_mib": free_mib()}
    try:
        planned = lucebox("plan", *options, "--json")
        plan = json.loads(planned.stdout) if planned.stdout else {}
        result |= {
            "plan_rc": planned.returncode,
            "plan_total_mib": plan.get("memory_bytes", {}).get("total", 0) / 2**20,
            "plan_ctx": plan.get("ctx"),
            "plan_kv": plan.get("cache_type_k"),
            "plan_spec": plan.get("spec"),
            "plan_draft_mib": plan.get("memory_bytes", {}).get("draft", 0) / 2**20,
        }
        if planned.returncode != 0:
            result["error"] = planned.stderr.strip()[-400:]
            return result
        log = (work / f"{case.name}.serve.log").open("w")
        serve = subprocess.Popen(
            [sys.executable, "-m", "lucebox.app.cli", "serve", *options, "--port", str(PORT)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            status = wait_ready(time.monotonic() + 300)
            result |= {"state": status.get("state"), "restarts": status.get("restarts")}
            if status.get("state") != "ready":
                return result
            url = status["url"]
            started = time.monotonic()
            replies = [ask(url, p) for p in PROMPTS]
            wall_s = time.monotonic() - started
            used = engine_mib(int(status["engine_pid"]))
            time.sleep(2.5)
            status = json.loads(lucebox("status", "--json").stdout)
            timings = [r.get("timings", {}) for r in replies]
            drafted = sum(t.get("draft_n", 0) for t in timings)
            accepted = sum(t.get("draft_n_accepted", 0) for t in timings)
            predicted = sum(t.get("predicted_n", 0) for t in timings)
            result |= {
                "engine_mib": used,
                "difference_percent": round(100 * (used - result["plan_total_mib"]) / used, 2)
                if used
                else None,
                "restarts": status.get("restarts"),
                "status_spec": status.get("spec"),
                "decode_tok_s": round(
                    predicted / sum(t.get("predicted_ms", 0) / 1000 for t in timings), 1
                ),
                "drafted": drafted,
                "accepted": accepted,
                "wall_s": round(wall_s, 2),
            }
            return result
        finally:
            os.killpg(serve.pid, signal.SIGTERM)
            serve.wait(timeout=60)
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()


PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Repeat this list exactly: alpha beta gamma delta epsilon zeta eta theta iota kappa.",
]


def model(work: Path, name: str, spec: ModelSpec) -> Path:
    path = work / f"{name}.gguf"
    if not path.exists():
        write_gguf(path, spec)
    return path


def speculation_cases(work: Path) -> dict[str, Case]:
    """Each speculation mode on generated files made GPU-sized (random weights: the memory
    and the argv are what these prove, not speed)."""
    shape: dict[str, Any] = {
        "n_layer": 16,
        "vocab_size": 32000,
        "n_ctx": 32768,
        "constant_weights": True,
    }
    hybrid = widen(qwen35_target(**shape), 32)
    plain_hybrid = widen(qwen35_target(mtp=False, **shape), 32)
    qwen3, qwen3_draft = qwen3_pair(**shape)
    return {
        "mtp": Case("mtp", model(work, "qwen35-mtp", hybrid), None, "mtp"),
        "dflash": Case(
            "dflash",
            model(work, "qwen35", plain_hybrid),
            model(work, "qwen35-dflash", dflash_for(plain_hybrid)),
            "dflash",
        ),
        "simple": Case(
            "simple",
            model(work, "qwen3", widen(qwen3, 16)),
            model(work, "qwen3-draft", widen(qwen3_draft, 16)),
            "draft",
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, default=Path(".devrun/work"))
    parser.add_argument(
        "--case",
        action="append",
        required=True,
        help="NAME:LEAVE_FREE_MIB with NAME one of pair, ngram, off, mtp, dflash, simple",
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    target = model(args.work, "llama-3b", LLAMA_3B)
    draft = model(args.work, "llama-1b-draft", LLAMA_1B_DRAFT)
    cases = {
        "pair": Case("pair", target, draft, "draft"),
        "ngram": Case("ngram", target, None, "ngram"),
        "off": Case("off", target, None, "off"),
        **speculation_cases(args.work),
    }
    for item in args.case:
        name, _, leave = item.partition(":")
        print(json.dumps(run_case(cases[name], int(leave or 16384), args.work)), flush=True)


if __name__ == "__main__":
    main()
