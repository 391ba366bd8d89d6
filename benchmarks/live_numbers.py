"""Benchmark: do the live numbers match the engine's own?

Serves SmolLM2-135M-Instruct the way `lucebox serve` does (its `prepare`, supervisor, run and
sampler) with the built CPU engine from the test cache (registered in a temporary
LUCEBOX_HOME), runs three shapes of steady load, and
compares what `lucebox status --json` reports with the `timings` the engine put in each reply:

1. short: back-to-back chat requests with short replies;
2. long: back-to-back requests with long replies (their progress shows while they run);
3. two at once: two clients back to back on two slots;
4. streamed (first, 100 by default): back-to-back streamed short replies, each followed at
   once by a read of the status lucebox keeps: its reading of that reply (decode rate, time to
   first token) against the engine's ``timings`` and the client's own wait for the first token,
   its 10 s window's decode rate against the engine's over the replies that window held (a
   median of window readings against a median of single replies compares different things
   when the rate swings), and how long after the reply's end the status showed it finished.

`lucebox serve` plans one slot on a CPU today, so the bench asks the engine for two
(the plan's `parallel`); nothing else differs from `lucebox serve --model SMOL --ctx 4096`.
Per shape it prints the engine's decode and prefill rates token-weighted over the shape
(decode steps over decode time, the engine's own rule), the sampler's, the difference, the
requests each side counted, and the median of the 10 s window rate `status` showed during it.

    .venv/bin/python -m benchmarks.live_numbers [--streamed 100] [--short 24] [--long 4]
        [--long-tokens 256] [--pairs 8] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from lucebox.engine import pipeline, runstart
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.engines import install, registry
from lucebox.engine.machine import gpu
from lucebox.engine.run.runstate import ServeLock, read_status
from lucebox.engine.run.serverrun.serverrun import ServerRun
from support.ports import free_port
from support.realmodels import engine_home, smol_model

TOPICS = ("the sea", "a lamp", "bread", "rain", "a bicycle", "tea", "a cat", "winter")


def chat(url: str, topic: str, max_tokens: int) -> dict[str, Any]:
    # A fresh connection per call: the engine may drop a kept-alive one after a reply.
    reply = httpx.post(
        f"{url}/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": f"Write about {topic}."}],
            "max_tokens": max_tokens,
            "temperature": 0.7,
        },
        timeout=600,
    )
    reply.raise_for_status()
    timings: dict[str, Any] = reply.json()["timings"]
    return timings


def streamed_chat(url: str, topic: str, max_tokens: int) -> tuple[float, float, dict[str, Any]]:
    """A streamed reply: (the client's wait for the first token, when the stream ended on
    this process's monotonic clock, the engine's ``timings`` from its last chunk)."""
    started_s = time.monotonic()
    first_s: float | None = None
    timings: dict[str, Any] = {}
    body = {
        "messages": [{"role": "user", "content": f"Write about {topic}."}],
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "stream": True,
    }
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
            if first_s is None and delta.get("content"):
                first_s = time.monotonic() - started_s
            timings = chunk.get("timings") or timings
    return (first_s if first_s is not None else float("nan")), time.monotonic(), timings


def fresh_sample(count: int, timeout_s: float = 10.0) -> tuple[dict[str, Any], float]:
    """The state file's sample once it counts ``count`` finished requests (read as `lucebox
    status` reads it, without a process per read), and when that was."""
    paths = resolve_paths()
    deadline = time.monotonic() + timeout_s
    while True:
        current = read_status(paths)
        sample = current.sample if current is not None else None
        now_s = time.monotonic()
        if sample is not None and (sample.requests_finished_total >= count or now_s > deadline):
            return dataclasses.asdict(sample), now_s
        time.sleep(0.005)


def streamed(url: str, replies: int, max_tokens: int) -> dict[str, Any]:
    """Back-to-back streamed replies, each checked against the status read right after it."""
    start = read_status(resolve_paths())
    base = start.sample.requests_finished_total if start and start.sample else 0
    rows = []
    for index in range(replies):
        client_ttft_s, ended_s, timings = streamed_chat(
            url, TOPICS[index % len(TOPICS)], max_tokens
        )
        sample, seen_s = fresh_sample(base + index + 1)
        rows.append(
            {
                "client_ttft_s": client_ttft_s,
                "engine_prompt_s": timings["prompt_ms"] / 1000,
                "status_ttft_s": sample["last_ttft_s"],
                "engine_decode_tok_s": timings["predicted_per_second"],
                "status_decode_tok_s": sample["last_decode_tokens_per_s"],
                "status_window_decode_tok_s": sample["decode_tokens_per_s"],
                "status_lag_s": seen_s - ended_s,
                "ended_s": ended_s,
                "seen_s": seen_s,
                "predicted_ms": timings["predicted_ms"],
                "status_window_s": sample["window_s"],
                "status_counted": sample["requests_finished_total"] >= base + index + 1,
                "predicted_n": timings["predicted_n"],
            }
        )
    decode_errors = [r["status_decode_tok_s"] / r["engine_decode_tok_s"] - 1 for r in rows]
    window_errors = [r["status_window_decode_tok_s"] / window_engine(rows, r) - 1 for r in rows]
    ttft_errors = [r["status_ttft_s"] / r["client_ttft_s"] - 1 for r in rows]
    engine = [r["engine_decode_tok_s"] for r in rows]
    window = [r["status_window_decode_tok_s"] for r in rows]
    return {
        "shape": "streamed short replies, status read after each",
        "requests": len(rows),
        "decode_tok_s_engine_median": round(statistics.median(engine), 3),
        "decode_tok_s_status_median": round(
            statistics.median(r["status_decode_tok_s"] for r in rows), 3
        ),
        "decode_error_percent_median": round(100 * statistics.median(decode_errors), 3),
        "decode_error_percent_worst": round(100 * max(decode_errors, key=abs), 3),
        "window_decode_tok_s_median": round(statistics.median(window), 3),
        "window_vs_engine_median_percent": round(
            100 * (statistics.median(window) / statistics.median(engine) - 1), 3
        ),
        "window_vs_engine_same_replies_percent_median": round(
            100 * statistics.median(window_errors), 3
        ),
        "window_vs_engine_same_replies_percent_worst": round(100 * max(window_errors, key=abs), 3),
        "ttft_s_client_median": round(statistics.median(r["client_ttft_s"] for r in rows), 4),
        "ttft_s_status_median": round(statistics.median(r["status_ttft_s"] for r in rows), 4),
        "ttft_error_percent_median": round(100 * statistics.median(ttft_errors), 3),
        "status_lag_s_median": round(statistics.median(r["status_lag_s"] for r in rows), 4),
        "status_lag_s_worst": round(max(r["status_lag_s"] for r in rows), 4),
        "stale_reads": sum(not r["status_counted"] for r in rows),
        "rows": rows,
    }


def window_engine(rows: list[dict[str, Any]], read: dict[str, Any]) -> float:
    """The engine's own decode rate (token-weighted, its rule) over the replies the status's
    window held when ``read`` was read: those that ended within the window before it (a
    reply's end on this side comes a few milliseconds after the engine's)."""
    held = [
        r
        for r in rows
        if read["seen_s"] - read["status_window_s"] <= r["ended_s"] <= read["seen_s"]
    ]
    steps = sum(r["predicted_n"] - 1 for r in held)
    return steps / (sum(r["predicted_ms"] for r in held) / 1000)


def status() -> dict[str, Any]:
    """`lucebox status --json`, as a script would ask for it."""
    done = subprocess.run(
        [sys.executable, "-m", "lucebox.app.entry", "status", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    document: dict[str, Any] = json.loads(done.stdout)
    return document


class Watch:
    """`lucebox status --watch --json` in the background: every sample it prints."""

    def __init__(self) -> None:
        self.samples: list[dict[str, Any]] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "lucebox.app.entry", "status", "--watch", "--json"],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.reader = threading.Thread(target=self._read)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            sample = json.loads(line).get("sample")
            if sample:
                self.samples.append(sample)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        self.reader.join()


class Server:
    """`lucebox serve`'s steps in a thread of this process, with two slots."""

    def __init__(self, port: int) -> None:
        self.paths = resolve_paths()
        self.lock = ServeLock(self.paths)
        options = pipeline.ServeOptions(model=str(smol_model()), ctx=4096, port=port)
        prepared = pipeline.prepare(self.paths, options, lambda event: None)
        plan = dataclasses.replace(prepared.plan, parallel=2)
        self.prepared = dataclasses.replace(prepared, launch=prepared.launch.with_plan(plan))
        self.loop = asyncio.new_event_loop()
        self.run: ServerRun | None = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._serve(),))
        self.thread.start()

    async def _serve(self) -> None:
        supervisor = runstart.new_supervisor(self.paths, self.prepared)
        self.run = runstart.server_run(self.paths, self.prepared, supervisor)
        async for item in self.run.events():
            if getattr(item, "kind", None) == "ready":
                self.ready.set()

    def stop(self) -> None:
        if self.run is not None:
            self.loop.call_soon_threadsafe(self.run.stop)
        self.thread.join(timeout=60)
        self.lock.release()


def settled(before: dict[str, Any], replies: int, timeout_s: float = 30) -> dict[str, Any]:
    """The status once the sampler has seen every reply finish (it samples once a second)."""
    deadline = time.monotonic() + timeout_s
    want = before["sample"]["requests_finished_total"] + replies
    while True:
        now = status()
        if now["sample"]["requests_finished_total"] >= want or time.monotonic() > deadline:
            return now
        time.sleep(0.5)


def engine_rates(timings: list[dict[str, Any]]) -> tuple[float, float]:
    steps = sum(t["predicted_n"] - 1 for t in timings)
    decode_s = sum(t["predicted_ms"] for t in timings) / 1000
    prompt = sum(t["prompt_n"] for t in timings)
    prompt_s = sum(t["prompt_ms"] for t in timings) / 1000
    return steps / decode_s, prompt / prompt_s


def shape(name: str, load: Callable[[], list[dict[str, Any]]]) -> dict[str, Any]:
    before = status()
    watch = Watch()
    timings = load()
    after = settled(before, len(timings))
    watch.close()
    b, a = before["sample"], after["sample"]
    sampled_decode = (a["decode_tokens_total"] - b["decode_tokens_total"]) / (
        a["decode_seconds_total"] - b["decode_seconds_total"]
    )
    sampled_prefill = (a["prefill_tokens_total"] - b["prefill_tokens_total"]) / (
        a["prefill_seconds_total"] - b["prefill_seconds_total"]
    )
    engine_decode, engine_prefill = engine_rates(timings)
    shown = [s["decode_tokens_per_s"] for s in watch.samples if s["decode_tokens_per_s"]]
    return {
        "shape": name,
        "requests_engine": len(timings),
        "requests_sampled": a["requests_finished_total"] - b["requests_finished_total"],
        "decode_tok_s_engine": round(engine_decode, 2),
        "decode_tok_s_sampled": round(sampled_decode, 2),
        "decode_error_percent": round(100 * (sampled_decode / engine_decode - 1), 3),
        "prefill_tok_s_engine": round(engine_prefill, 2),
        "prefill_tok_s_sampled": round(sampled_prefill, 2),
        "prefill_error_percent": round(100 * (sampled_prefill / engine_prefill - 1), 3),
        "window_decode_tok_s_median_shown": round(statistics.median(shown), 2) if shown else None,
        "per_reply_decode_tok_s_median": round(
            statistics.median(t["predicted_per_second"] for t in timings), 2
        ),
        "samples_shown": len(watch.samples),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streamed", type=int, default=100, help="streamed short replies")
    parser.add_argument("--streamed-tokens", type=int, default=16, help="tokens of each")
    parser.add_argument("--out", type=Path, help="also write the results (JSON) here")
    parser.add_argument("--short", type=int, default=24, help="short replies, back to back")
    parser.add_argument("--long", type=int, default=4, help="long replies, back to back")
    parser.add_argument("--long-tokens", type=int, default=256, help="tokens of a long reply")
    parser.add_argument("--pairs", type=int, default=8, help="requests per client, two at once")
    args = parser.parse_args()
    # A home of its own, with the test cache's built engine registered in place: the bench
    # does not hold the lock of the home the slow tests serve from.
    home = Path(tempfile.mkdtemp(prefix="lucebox-live-bench-"))
    os.environ["LUCEBOX_HOME"] = str(home)
    cached = resolve_paths({"LUCEBOX_HOME": str(engine_home())})
    built = registry.select_engine(cached, gpu.probe_gpus()).engine
    if built is None:
        raise SystemExit(f"no CPU engine built in {engine_home()}: run the slow tests once")
    install.add_engine(resolve_paths(), Path(built.server_path))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = Server(port)
    try:
        if not server.ready.wait(timeout=600):
            raise SystemExit("the server did not become ready")
        while status()["sample"] is None:
            time.sleep(0.5)

        def back_to_back(count: int, max_tokens: int) -> list[dict[str, Any]]:
            return [chat(url, TOPICS[i % len(TOPICS)], max_tokens) for i in range(count)]

        def two_at_once() -> list[dict[str, Any]]:
            replies: list[dict[str, Any]] = []
            clients = [
                threading.Thread(target=lambda: replies.extend(back_to_back(args.pairs, 48)))
                for _ in range(2)
            ]
            for client in clients:
                client.start()
            for client in clients:
                client.join()
            return replies

        results = [streamed(url, args.streamed, args.streamed_tokens)] if args.streamed else []
        if args.short:
            results.append(shape("short replies", lambda: back_to_back(args.short, 16)))
        if args.long:
            results.append(shape("long replies", lambda: back_to_back(args.long, args.long_tokens)))
        if args.pairs:
            results.append(shape("two at once", two_at_once))
        final = status()
    finally:
        server.stop()
    shutil.rmtree(home, ignore_errors=True)
    document = {"shapes": results, "cache": final["cache"], "spec": final["spec"]}
    if args.out is not None:
        args.out.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({**document, "shapes": [summary(s) for s in results]}, indent=1))


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """A shape's figures without its per-reply rows."""
    return {k: v for k, v in result.items() if k != "rows"}


if __name__ == "__main__":
    main()
