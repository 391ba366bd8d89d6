"""Benchmark: does `lucebox serve` with nothing pinned compare both engines by itself?

Starts `lucebox serve --model TARGET --draft DRAFT --ctx CTX` (the calibration on at its default
idle wait, no engine, mode or speculation pinned) in the LUCEBOX_HOME both engines were built
in, waits until the engine calibration has stored a verdict (or DEADLINE), then sends streamed
chats as a chat app does on one open connection and reads back what `lucebox status --json`
says: which engine kind serves and what chose it, the requests it counts, its window time to
first token beside the clients' own. Writes the store's ``engines`` section and `plan --json`'s
engine choice next to them. Every figure comes from serve's own calibration.

    python3 -m benchmarks.engine_choice_on_auto TARGET DRAFT OUT.json [--ctx 32768] [--port 18270]
        [--deadline-s 900] [--chats 8] [--serve-args "--gpu 0"] [--temperature 0.7]

With ``--temperature T`` every chat sends it, and two chats go first, as soon as serve answers,
so the sampling the calibration measures at is the clients' (unset: each engine's defaults
made equal by lucebox).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.plan.speculation import measurements
from lucebox.engine.run.front.frontwire import CARRIES_TOKEN

CLI = [sys.executable, "-m", "lucebox.app.cli"]
USAGE_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


def lucebox_json(*args: str) -> Any:
    done = subprocess.run([*CLI, *args, "--json"], capture_output=True, text=True, check=False)
    try:
        return json.loads(done.stdout)
    except ValueError:
        return {"exit_code": done.returncode, "stderr": done.stderr[-2000:]}


def chats(url: str, count: int, temperature: float | None) -> list[dict[str, float]]:
    """Streamed chats on one open connection, each with a fresh prompt, at ``temperature``
    (None: left unset, as most clients do): the wait for the first token, the whole reply and
    the tokens the reply counted, as the client saw them."""
    seen = []
    with httpx.Client(timeout=300) as client:
        client.get(f"{url}/health")
        for number in range(count):
            prompt = f"Note {number} of {time.time():.3f}: write two sentences about the sea."
            body = {
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 256,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            if temperature is not None:
                body["temperature"] = temperature
            sent_s = time.perf_counter()
            first, tokens = None, 0
            with client.stream("POST", f"{url}/v1/chat/completions", json=body) as reply:
                for chunk in reply.iter_raw():
                    if first is None and CARRIES_TOKEN.search(chunk):
                        first = time.perf_counter() - sent_s
                    tokens = _completion_tokens(chunk) or tokens
            total_s = time.perf_counter() - sent_s
            decode_s = total_s - (first or 0.0)
            seen.append(
                {
                    "ttft_s": first or 0.0,
                    "total_s": total_s,
                    "tokens": tokens,
                    "decode_tok_s": round(tokens / decode_s, 1) if tokens and decode_s > 0 else 0.0,
                }
            )
    return seen


def _completion_tokens(chunk: bytes) -> int:
    """The usage's completion tokens where this chunk carries them (the stream's last event)."""
    found = USAGE_TOKENS.search(chunk)
    return int(found.group(1)) if found else 0


def lead_chats(
    serve: subprocess.Popen[bytes], url: str, deadline_s: float, temperature: float | None
) -> list[dict[str, float]]:
    """Once serve answers, two chats at the clients' sampling: the front records it, so the
    idle calibration that follows measures at it (before any traffic, the defaults stand in)."""
    while time.monotonic() < deadline_s and serve.poll() is None:
        if lucebox_json("status").get("state") == "ready":
            return chats(url, 2, temperature)
        time.sleep(1)
    return []


def wait_for_verdict(
    serve: subprocess.Popen[bytes], deadline_s: float, log: list[dict[str, Any]]
) -> dict[str, Any]:
    """Until the status says the measured engine serves, serve ends, or the deadline; the last
    status (the state file says stopped until serve has planned and started the engine)."""
    status: dict[str, Any] = {}
    while time.monotonic() < deadline_s and serve.poll() is None:
        status = lucebox_json("status")
        engine = status.get("engine") or {}
        log.append({"at_s": round(time.time(), 1), "state": status.get("state"), "engine": engine})
        if status.get("state") == "ready" and engine.get("chosen_by") == "measured":
            return status
        if status.get("state") == "failed":
            return status
        time.sleep(5)
    return status


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("draft")
    parser.add_argument("out", type=Path)
    parser.add_argument("--ctx", type=int, default=32768)
    parser.add_argument("--port", type=int, default=18270)
    parser.add_argument("--deadline-s", type=float, default=900)
    parser.add_argument("--chats", type=int, default=8)
    parser.add_argument("--serve-args", default="")
    parser.add_argument("--temperature", type=float, default=None, help="unset: left to defaults")
    args = parser.parse_args()
    started = time.monotonic()
    serve_args = ["--model", args.target, "--draft", args.draft, "--ctx", str(args.ctx)]
    serve_args += ["--port", str(args.port), *shlex.split(args.serve_args)]
    result: dict[str, Any] = {
        "path": "lucebox serve on auto, calibration on (its own idle wait), nothing pinned",
        "command": ["lucebox", "serve", *serve_args],
        "clients_temperature": args.temperature,
    }
    serve = subprocess.Popen(
        [*CLI, "serve", *serve_args],
        stdout=(args.out.parent / "serve.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    timeline: list[dict[str, Any]] = []
    url = f"http://127.0.0.1:{args.port}"
    try:
        result["lead_chats"] = lead_chats(serve, url, started + args.deadline_s, args.temperature)
        status = wait_for_verdict(serve, started + args.deadline_s, timeline)
        result["verdict_after_s"] = round(time.monotonic() - started, 1)
        result["status_at_verdict"] = status
        if status.get("state") == "ready":
            seen = chats(url, args.chats, args.temperature)
            time.sleep(2)  # one sample after the last reply
            after = lucebox_json("status")
            sample = after.get("sample") or {}
            waits = [s["ttft_s"] for s in seen]
            result["clients"] = {
                "replies": seen,
                "ttft_s_mean": statistics.mean(waits),
                "ttft_s_median": statistics.median(waits),
                "decode_tok_s_median": statistics.median(s["decode_tok_s"] for s in seen),
            }
            result["status_after_clients"] = {
                "engine": after.get("engine"),
                "requests_finished_total": sample.get("requests_finished_total"),
                "ttft_s": sample.get("ttft_s"),
                "decode_tokens_per_s": sample.get("decode_tokens_per_s"),
                "restarts": after.get("restarts"),
                "spec": after.get("spec"),
                "sampling": after.get("sampling"),
            }
        plan = lucebox_json("plan", *serve_args[:6])
        result["plan_engine"] = plan.get("engine") if isinstance(plan, dict) else plan
        paths = resolve_paths(os.environ)
        result["store_engines"] = measurements.read_section(paths, "engines")
        result["store_spec"] = measurements.read_section(paths, "entries")
    finally:
        result["timeline"] = timeline
        subprocess.run([*CLI, "down"], capture_output=True, check=False)
        try:
            serve.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(serve.pid, signal.SIGKILL)
        args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result.get(k) for k in ("verdict_after_s", "status_after_clients")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
