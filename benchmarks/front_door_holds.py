"""Benchmark: does lucebox's front door hold against hostile and buggy clients?

`lucebox serve` of SmolLM2 on the CPU's real llama-server (loopback), then, while an honest
client asks a short chat once a second: at least 1,000 hostile bodies over every API path, by
category (malformed and truncated JSON, nesting bombs, oversized bodies, wrong types, huge
counts, hostile image URLs, random mutations of valid bodies), then 200 idle connections from
one address and 20 senders writing a byte a second. Counted: the answers by status per
category, tracebacks in serve's output, engine restarts, the serve process's largest resident
memory, and the honest client's answers.

    python -m benchmarks.front_door_holds [--out FILE] [--seed 7]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil

from support.health import wait_healthy
from support.ports import free_port
from support.realmodels import smol_model
from support.smolserver import private_engine_home

PATHS = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/responses",
    "/completion",
    "/v1/embeddings",
    "/tokenize",
)
VALID: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    "/v1/completions": {"prompt": "hi", "max_tokens": 4},
    "/v1/messages": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    "/v1/responses": {"input": "hi", "max_output_tokens": 4},
    "/completion": {"prompt": "hi", "n_predict": 4},
    "/v1/embeddings": {"input": "hi"},
    "/tokenize": {"content": "hi"},
}
HOSTILE_URLS = (
    "file:///etc/passwd",
    "http://169.254.169.254/latest/meta-data/",
    "http://0.0.0.0:22/",
    "gopher://127.0.0.1:25/",
    "ftp://example.com/a.png",
    "data:image/png;base64," + "A" * 200_000,
    "http://[fe80::1]/a.png",
    "\x00\x01http://x",
)


def _nested(depth: int, kind: str) -> bytes:
    return (
        ("[" * depth) + ("]" * depth) if kind == "array" else '{"a":' * depth + "1" + "}" * depth
    ).encode()


def bodies(rng: random.Random) -> Iterator[tuple[str, str, bytes]]:
    """(category, path, body) for every hostile request sent over HTTP."""
    for path in PATHS:
        valid = json.dumps(VALID[path]).encode()
        for cut in range(1, len(valid), max(1, len(valid) // 20)):
            yield "malformed", path, valid[:cut]
        for _ in range(10):
            yield "malformed", path, bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
        for depth in (100, 1_000, 5_000, 50_000):
            yield "nesting", path, _nested(depth, "array")
            yield "nesting", path, _nested(depth, "object")
        wrong: tuple[tuple[str, Any], ...] = (
            ("messages", "hi"),
            ("messages", 7),
            ("messages", [7, None, "x"]),
            ("max_tokens", "many"),
            ("max_tokens", -5),
            ("temperature", "hot"),
            ("stream", "yes"),
            ("model", {"x": 1}),
            ("prompt", [[1, 2], {"a": None}]),
            ("input", 3.5),
        )
        for field, value in wrong:
            yield "wrong-types", path, json.dumps({**VALID[path], field: value}).encode()
        huge: tuple[tuple[str, Any], ...] = (
            ("n", 10**9),
            ("max_tokens", 10**12),
            ("n_predict", 10**12),
            ("messages", [{"role": "user", "content": "x"}] * 20_000),
            ("logit_bias", {str(i): 1 for i in range(50_000)}),
            ("stop", ["x"] * 10_000),
        )
        for field, value in huge:
            yield "huge-counts", path, json.dumps({**VALID[path], field: value}).encode()
        for url in HOSTILE_URLS:
            image = {"type": "image_url", "image_url": {"url": url}}
            message = {"role": "user", "content": [{"type": "text", "text": "see"}, image]}
            yield "hostile-urls", path, json.dumps({**VALID[path], "messages": [message]}).encode()
        for _ in range(80):
            mutated = bytearray(valid)
            for _ in range(rng.randrange(1, 6)):
                spot = rng.randrange(len(mutated))
                mutated[spot] = rng.randrange(256)
            yield "mutations", path, bytes(mutated)


def _oversized(port: int) -> list[int]:
    """A 64 MiB Content-Length announced (an answer before the body is read), and 40 MiB sent."""
    seen = []
    for announced, sent in ((64 << 20, 1 << 16), (40 << 20, 40 << 20)):
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            head = (
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {announced}\r\n\r\n"
            )
            sock.sendall(head.encode())
            with contextlib.suppress(OSError):  # answered and closed while sending: the limit
                sock.sendall(b"[" * sent)
            reply = sock.recv(200).decode("latin-1", errors="replace")
            seen.append(int(reply.split()[1]) if reply.startswith("HTTP/1.1") else 0)
    return seen


def _idle_and_slow(port: int, stop: threading.Event) -> dict[str, int]:
    idle = []
    for _ in range(200):
        try:
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError:
            break
    slow = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(20)]
    text = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 30\r\n\r\n"
    for byte in range(12):
        for sock in slow:
            with contextlib.suppress(OSError):
                sock.sendall(text[byte : byte + 1])
        if stop.wait(1.0):
            break
    for sock in idle + slow:
        sock.close()
    return {"idle_opened": len(idle), "slow_senders": len(slow)}


def _honest(url: str, stop: threading.Event, answers: Counter[str]) -> None:
    body = {"messages": [{"role": "user", "content": "Say ok."}], "max_tokens": 4}
    while not stop.is_set():
        try:
            status = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).status_code
            answers[str(status)] += 1
        except httpx.HTTPError as exc:
            answers[type(exc).__name__] += 1
        stop.wait(1.0)


def _memory(pid: int, stop: threading.Event, peak: list[int]) -> None:
    process = psutil.Process(pid)
    while not stop.is_set():
        try:
            peak[0] = max(peak[0], process.memory_info().rss)
        except psutil.Error:
            return
        stop.wait(0.5)


def run(seed: int) -> dict[str, Any]:
    home = private_engine_home(Path(tempfile.mkdtemp(prefix="fuzz-home-")))
    env = {**os.environ, "LUCEBOX_HOME": str(home)}
    port = free_port()
    log = home / "serve.log"
    argv = ["serve", "--model", str(smol_model()), "--ctx", "2048", "--port", str(port)]
    serve = subprocess.Popen(
        [sys.executable, "-m", "lucebox.app.cli", *argv],
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    stop = threading.Event()
    honest: Counter[str] = Counter()
    peak = [0]
    results: dict[str, Any] = {"categories": {}}
    try:
        assert wait_healthy(url, 600, serve), "lucebox serve did not get ready"
        watchers = [
            threading.Thread(target=_honest, args=(url, stop, honest), daemon=True),
            threading.Thread(target=_memory, args=(serve.pid, stop, peak), daemon=True),
        ]
        for thread in watchers:
            thread.start()
        by_category: dict[str, Counter[str]] = {}
        with httpx.Client(timeout=60) as client:
            for category, path, body in bodies(random.Random(seed)):
                headers = {"content-type": "application/json"}
                try:
                    status = str(client.post(url + path, content=body, headers=headers).status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                by_category.setdefault(category, Counter())[status] += 1
        by_category["oversized"] = Counter(str(s) for s in _oversized(port))
        results["connections"] = _idle_and_slow(port, stop)
        results["categories"] = {k: dict(v) for k, v in by_category.items()}
        results["hostile_requests"] = sum(sum(v.values()) for v in by_category.values())
        results["answers_500"] = sum(v.get("500", 0) for v in by_category.values())
        time.sleep(2)
        shown = subprocess.run(
            [sys.executable, "-m", "lucebox.app.cli", "status", "--json"],
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        results["engine_restarts"] = json.loads(shown.stdout or "{}").get("restarts")
    finally:
        stop.set()
        subprocess.run(
            [sys.executable, "-m", "lucebox.app.cli", "down"], env=env, check=False,
            capture_output=True,
        )  # fmt: skip
        serve.wait(timeout=120)
    output = log.read_text(errors="replace")
    results["tracebacks"] = output.count("Traceback")
    results["serve_peak_rss_mib"] = round(peak[0] / 2**20, 1)
    results["honest_client"] = dict(honest)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    results = {"command": "python -m benchmarks.front_door_holds " + " ".join(sys.argv[1:])}
    results |= run(args.seed)
    text = json.dumps(results, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
