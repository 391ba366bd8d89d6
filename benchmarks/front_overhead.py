"""Benchmark: what lucebox's front (engine/run/front/front.py) costs a client, in one run.

The same streamed chat request goes to the engine directly and through the front, alternately
(so both see the same machine load), ``--requests`` times each; per request the client-side
time to the first content token (TTFT) and the decode rate (content chunks after the first,
over the time from the first to the last). Goal: under 5% of decode tok/s, under 50 ms TTFT.

Without URLs it serves SmolLM2 on the built CPU engine of the test cache (support/realmodels.py)
with the front on a thread of this process. With ``--engine-url`` and ``--front-url`` it
measures a running `lucebox serve` (the engine's private port and the front's), as
`drive.sh front_clients_gpu` does on the GPU.

    .venv/bin/python -m benchmarks.front_overhead [--requests 8] [--max-tokens 64] [--out FILE]
    python3 -m benchmarks.front_overhead --engine-url URL --front-url URL [--key KEY] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

PROMPT = "Write a short story about a lighthouse keeper and the sea."


def streamed_call(url: str, max_tokens: int, key: str | None) -> dict[str, float]:
    """One streamed chat request: TTFT and decode rate as the client sees them."""
    body = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    sent_s = time.perf_counter()
    arrivals: list[float] = []
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=600
    ) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            choices = chunk.get("choices") or [{}]
            if (choices[0].get("delta") or {}).get("content"):
                arrivals.append(time.perf_counter())
    if len(arrivals) < 2:
        raise RuntimeError(f"{url} streamed {len(arrivals)} content chunks")
    decode_s = arrivals[-1] - arrivals[0]
    return {
        "ttft_s": arrivals[0] - sent_s,
        "decode_tokens_per_s": (len(arrivals) - 1) / decode_s if decode_s > 0 else 0.0,
        "chunks": len(arrivals),
    }


def compare(
    engine_url: str, front_url: str, requests: int, max_tokens: int, key: str | None
) -> dict[str, Any]:
    """Both paths, alternately, after one warm-up call each; medians and the front's cost."""
    streamed_call(engine_url, 4, None)
    streamed_call(front_url, 4, key)
    calls: dict[str, list[dict[str, float]]] = {"engine": [], "front": []}
    for index in range(requests):
        order = ("engine", "front") if index % 2 == 0 else ("front", "engine")
        for name in order:
            url, sent_key = (engine_url, None) if name == "engine" else (front_url, key)
            calls[name].append(streamed_call(url, max_tokens, sent_key))
    median = {
        name: {
            "ttft_s": statistics.median(c["ttft_s"] for c in done),
            "decode_tokens_per_s": statistics.median(c["decode_tokens_per_s"] for c in done),
        }
        for name, done in calls.items()
    }
    engine, front = median["engine"], median["front"]
    return {
        "requests": requests,
        "max_tokens": max_tokens,
        "calls": calls,
        "median": median,
        "ttft_added_ms": round((front["ttft_s"] - engine["ttft_s"]) * 1000, 2),
        "decode_cost_percent": round(
            100 * (1 - front["decode_tokens_per_s"] / engine["decode_tokens_per_s"]), 2
        ),
    }


@contextlib.contextmanager
def cpu_engine_and_front() -> Iterator[tuple[str, str]]:
    """SmolLM2 on the test cache's CPU engine, and the front before it on this process with
    the API shapes serverrun gives it."""
    from lucebox.engine.run.front.apishape import Shapes
    from lucebox.engine.run.front.frontsetup import FrontSetup
    from support.engineserver import running_server
    from support.frontserver import loopback_policy, running_front
    from support.realmodels import engine_home, smol_model

    found = subprocess.run(
        [sys.executable, "-m", "lucebox.app.cli", "engine", "path"],
        env={**os.environ, "LUCEBOX_HOME": str(engine_home())},
        capture_output=True,
        text=True,
        check=True,
    )
    server_path = Path(found.stdout.strip())
    with (
        running_server(server_path, smol_model(), ["--jinja"]) as engine,
        running_front(
            FrontSetup(loopback_policy(), "smol", 2048),
            engine.url,
            Shapes("llama-server", "smol", 2048, thinking_default=False),
        ) as front,
    ):
        yield engine.url, front.url


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--engine-url")
    parser.add_argument("--front-url")
    parser.add_argument("--key")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.engine_url and args.front_url:
        result = compare(args.engine_url, args.front_url, args.requests, args.max_tokens, args.key)
        result["where"] = "given URLs"
    else:
        with cpu_engine_and_front() as (engine_url, front_url):
            result = compare(engine_url, front_url, args.requests, args.max_tokens, None)
        result["where"] = "CPU, SmolLM2-135M Q4_1, llama-server b11434"
    median = result["median"]
    print(
        f"engine: TTFT {median['engine']['ttft_s'] * 1000:.1f} ms, "
        f"{median['engine']['decode_tokens_per_s']:.1f} tok/s; "
        f"front: TTFT {median['front']['ttft_s'] * 1000:.1f} ms, "
        f"{median['front']['decode_tokens_per_s']:.1f} tok/s; "
        f"front adds {result['ttft_added_ms']} ms TTFT, costs "
        f"{result['decode_cost_percent']}% decode"
    )
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
