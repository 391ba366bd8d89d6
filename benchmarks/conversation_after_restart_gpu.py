"""Benchmark: is a long conversation warm after `lucebox down` and `serve`, on a GPU, per engine?

`lucebox serve --model TARGET --ctx CTX` as a user types it (auto, calibration on), then again
with each engine pinned: a conversation of about PROMPT tokens (the generated model reads a byte
a token) in two turns, `lucebox down`, `lucebox serve` with the same options, a third turn
extending the second; beside it, a prompt of the same size that shares nothing (cold). With
``--swap-to OTHER``, then a swap: `down`, `serve --model OTHER` and one turn there, `down`,
`serve` of TARGET again and a fourth turn extending the third. With ``--sleep-s S`` (the
``server.sleep_idle_s`` setting, set for the run and put back after), then a sleep: the run idles
until ``status`` says its engine sleeps, and one more turn wakes it. The client's time to the first
token of each turn and, where the reply says it, the tokens the engine read (llama-server's
``timings.prompt_n``); for the Lucebox engine, what its disk prefix cache logged (``[disk-cache]``
lines: hits, saves) and what ``status`` says it keeps.

    python3 -m benchmarks.conversation_after_restart_gpu TARGET OUT.json [--prompt 50000]
        [--ctx 65536] [--engines auto,llama-server,lucebox] [--serve-args "--gpu 0"]
        [--swap-to OTHER.gguf] [--sleep-s 20]
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

CLI = [sys.executable, "-m", "lucebox.app.cli"]
READY_S = 600.0


def _cli(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, check=False, timeout=timeout_s
    )


def _status() -> dict[str, Any]:
    try:
        found: dict[str, Any] = json.loads(_cli("status", "--json").stdout)
    except ValueError:
        return {}
    return found


def _serve(options: list[str]) -> str:
    done = _cli("serve", "--detach", *options)
    if done.returncode != 0:
        raise RuntimeError(f"serve --detach failed: {done.stderr[-1500:]}")
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        status = _status()
        if status.get("state") == "ready":
            return str(status["url"])
        if status.get("state") == "failed":
            raise RuntimeError(f"serve failed: {status.get('cause')}")
        time.sleep(1)
    raise RuntimeError("serve was not ready in time")


def _turn(url: str, key: str | None, messages: list[dict[str, str]]) -> dict[str, Any]:
    body = {"messages": messages, "max_tokens": 16, "stream": False, "temperature": 0}
    headers = {"authorization": f"Bearer {key}"} if key else {}
    sent_s = time.perf_counter()
    reply = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=600)
    took_s = time.perf_counter() - sent_s
    data = reply.json() if reply.status_code == 200 else {}
    timings = data.get("timings") or {}
    content = ((data.get("choices") or [{}])[0].get("message") or {}).get("content") or ""
    return {
        "status": reply.status_code,
        "reply_s": round(took_s, 3),
        "prompt_n": timings.get("prompt_n"),
        "cache_n": timings.get("cache_n"),
        "content": content,
    }


def conversation(prompt_tokens: int, salt: str) -> list[dict[str, str]]:
    note = (f"{salt} project note, line of context. " * (prompt_tokens // 36 + 1))[:prompt_tokens]
    return [{"role": "system", "content": note}, {"role": "user", "content": "First step?"}]


def _options(engine: str, model: str, args: argparse.Namespace) -> list[str]:
    options = ["--model", model, "--ctx", str(args.ctx), *shlex.split(args.serve_args)]
    return options if engine == "auto" else [*options, "--engine", engine]


def _kept() -> dict[str, Any]:
    """What the running server says it restored and keeps, and its disk cache's log lines."""
    cache = _status().get("cache") or {}
    log = _cli("logs").stdout.splitlines()
    disk = [line for line in log if line.startswith("[disk-cache]") or "disk_hit=true" in line]
    keys = ("last_restore", "disk_entries", "disk_bytes")
    return {**{key: cache.get(key) for key in keys}, "disk_lines": disk[-12:]}


def _swap(engine: str, args: argparse.Namespace, seen: dict[str, Any], messages: list) -> str:
    """Serve another model for a turn, then the target again: its next turn after the swap."""
    _cli("down", timeout_s=180)
    url = _serve(_options(engine, args.swap_to, args))
    seen["other_model_turn"] = _turn(url, None, conversation(2000, f"{engine} other model"))
    _cli("down", timeout_s=180)
    url = _serve(_options(engine, args.target, args))
    messages += [{"role": "assistant", "content": seen["turn3_after_restart"]["content"]}]
    messages += [{"role": "user", "content": "And after the swap?"}]
    seen["turn4_after_swap"] = _turn(url, None, messages)
    seen["kept_after_swap"] = _kept()
    return url


def _sleep(args: argparse.Namespace, seen: dict[str, Any], messages: list, url: str) -> None:
    """Idle until the engine sleeps, then the next turn, which wakes it."""
    deadline = time.monotonic() + args.sleep_s + READY_S
    while time.monotonic() < deadline and not (_status().get("sleep") or {}).get("asleep"):
        time.sleep(1)
    seen["asleep_seen"] = bool((_status().get("sleep") or {}).get("asleep"))
    last = seen.get("turn4_after_swap") or seen["turn3_after_restart"]
    messages += [{"role": "assistant", "content": last["content"]}]
    messages += [{"role": "user", "content": "And after the sleep?"}]
    seen["turn_after_sleep"] = _turn(url, None, messages)
    seen["kept_after_sleep"] = _kept()


def one_engine(engine: str, target: str, args: argparse.Namespace) -> dict[str, Any]:
    options = _options(engine, target, args)
    url = _serve(options)
    served = _status().get("engine") or {}
    messages = conversation(args.prompt, f"{engine} conversation")
    seen: dict[str, Any] = {"options": options, "engine": served}
    seen["turn1"] = _turn(url, None, messages)
    messages += [{"role": "assistant", "content": seen["turn1"]["content"]}]
    messages += [{"role": "user", "content": "And the next one?"}]
    seen["turn2_warm"] = _turn(url, None, messages)
    _cli("down", timeout_s=180)
    url = _serve(options)
    messages += [{"role": "assistant", "content": seen["turn2_warm"]["content"]}]
    messages += [{"role": "user", "content": "Then?"}]
    seen["turn3_after_restart"] = _turn(url, None, messages)
    seen["kept_after_restart"] = _kept()
    if args.swap_to:
        url = _swap(engine, args, seen, messages)
    if args.sleep_s:
        _sleep(args, seen, messages, url)
    seen["cold_same_size"] = _turn(url, None, conversation(args.prompt, f"{engine} unrelated"))
    _cli("down", timeout_s=180)
    return seen


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("out", type=Path)
    parser.add_argument("--prompt", type=int, default=50000)
    parser.add_argument("--ctx", type=int, default=65536)
    parser.add_argument("--engines", default="auto,llama-server,lucebox")
    parser.add_argument("--serve-args", default="")
    parser.add_argument("--swap-to", default="", help="another model to swap to and back from")
    parser.add_argument(
        "--sleep-s", type=float, default=0.0, help="server.sleep_idle_s for the run"
    )
    args = parser.parse_args()
    results: dict[str, Any] = {
        "command": "python3 -m benchmarks.conversation_after_restart_gpu " + " ".join(sys.argv[1:]),
        "path": "lucebox serve as typed (auto first, then each engine pinned), calibration on",
    }
    if args.sleep_s:
        _cli("config", "set", "server.sleep_idle_s", str(args.sleep_s))
    try:
        for engine in args.engines.split(","):
            try:
                results[engine] = one_engine(engine, args.target, args)
            except (RuntimeError, httpx.HTTPError, subprocess.TimeoutExpired) as exc:
                results[engine] = {"error": str(exc)}
                _cli("down", timeout_s=180)
            args.out.write_text(json.dumps(results, indent=1) + "\n")
    finally:
        if args.sleep_s:
            _cli("config", "set", "server.sleep_idle_s", "0")
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
