"""Benchmark: does a client's conversation survive a stop and start of the run (issue 55)?

One agent-shaped chat (a ~3,000-token system note, short tool results, the earlier replies sent
back as clients send them) served by the built CPU llama-server of the test cache behind
lucebox's front, in this process, for SmolLM2 (plain attention) and a generated qwen35 hybrid
(recurrent layers, 8x the tests' width). The time to the first token of one more turn (the
whole reply is one token) and the tokens the engine read for it, measured:

- warm: the run that served the turns before;
- after restart: the run stopped and started again (the slot saved and restored);
- after probe: a calibration's probe took the slot, then the run restarted (a trial);
- after sleep: the run's engine slept once idle (``server.sleep_idle_s``, its slot saved) and
  the turn woke it (the engine's start and the slot's restore are in its wait); "before sleep"
  is the turn before it, warm in that run;
- cold: a new run with no saved slot.

    .venv/bin/python -m benchmarks.conversation_survives_restart [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from lucebox.engine.run.calibrate.probing import WARM_UP, ask
from support.agentrun import Served, agent_launch
from support.ggufgen import cached_gguf, qwen35_target, widen
from support.realmodels import engine_home, smol_model

CTX = 8192
NOTE = "Here is a long project note to keep in mind. "
REPEATS = {"qwen35-hybrid": 60, "smollm2": 250}
"""The generated model's tokenizer reads a byte a token, SmolLM2's about a word: ~3,000 each."""


SLEEP_IDLE_S = 2.0
"""Short: the bench waits it out once."""
HYBRID_WIDTH = 8
"""The generated hybrid 8x wider than the tests' (n_embd 512): reading a prompt takes long
enough to tell a warm turn from a cold one by time, not only by tokens."""


def model_path(name: str) -> Path:
    if name == "smollm2":
        return smol_model()
    return cached_gguf(widen(qwen35_target(mtp=False, n_ctx=32768), HYBRID_WIDTH))


async def turn(
    url: str, messages: list[dict[str, str]], question: str, max_tokens: int
) -> dict[str, Any]:
    """One turn as a client sends it; its wall time (to the reply's end), prompt and cache."""
    messages.append({"role": "user", "content": question})
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=600) as client:
        reply = await client.post(f"{url}/v1/chat/completions", json=body)
    wall_s = time.monotonic() - started
    reply.raise_for_status()
    answer = reply.json()
    messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
    timings = answer["timings"]
    return {
        "ttft_s": round(wall_s, 3),
        "prompt_n": timings["prompt_n"],
        "cache_n": timings["cache_n"],
        "prompt_ms": round(timings["prompt_ms"], 1),
    }


async def measure(name: str, folder: Path) -> dict[str, Any]:
    slots = folder / "slots"
    slots.mkdir()
    launch = agent_launch(engine_home(), model_path(name), slots, CTX)
    home, log = folder / "home", folder / "engine.log"
    messages = [{"role": "system", "content": "You are a coding agent. " + NOTE * REPEATS[name]}]
    found: dict[str, Any] = {}

    served = Served(launch, home, log)
    try:
        await served.ready()
        url = served.run.public_url
        found["first"] = await turn(url, messages, "What is the note about?", 12)
        await turn(url, messages, "tool result: ok", 12)
        found["warm"] = await turn(url, messages, "tool result: 3 files changed", 1)
    finally:
        await served.stop()

    served = Served(launch, home, log)
    try:
        await served.ready()
        url = served.run.public_url
        found["after_restart"] = await turn(url, messages, "tool result: build passed", 1)
        async with httpx.AsyncClient(timeout=600) as client:
            await ask(client, served.run, WARM_UP)
        pid = served.run.status.engine_pid
        served.run.restart()
        await served.ready(not_pid=pid)
        found["after_probe"] = await turn(url, messages, "tool result: tests pass", 1)
    finally:
        await served.stop()

    served = Served(launch, home, log, sleep_idle_s=SLEEP_IDLE_S)
    try:
        await served.ready()
        url = served.run.public_url
        found["before_sleep"] = await turn(url, messages, "tool result: lint clean", 1)
        await served.asleep()
        found["after_sleep"] = await turn(url, messages, "tool result: deployed", 1)
    finally:
        await served.stop()

    for saved in slots.iterdir():
        saved.unlink()
    served = Served(launch, home, log)
    try:
        await served.ready()
        found["cold"] = await turn(served.run.public_url, messages, "tool result: pushed", 1)
    finally:
        await served.stop()
    found["lucebox_slot_lines"] = slot_lines(log)
    return found


def slot_lines(log: Path) -> list[str]:
    """What lucebox wrote in the engine log about saving and restoring the slot."""
    said = log.read_text(errors="replace").splitlines()
    return [line for line in said if line.startswith("# lucebox: slot")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {"ctx": CTX, "threads": os.cpu_count()}
    for name in REPEATS:
        with tempfile.TemporaryDirectory(prefix="lucebox-conversation-") as folder:
            results[name] = asyncio.run(measure(name, Path(folder)))
    return write_results(
        results, ["python", "-m", "benchmarks.conversation_survives_restart"], args.out
    )


def write_results(results: dict[str, Any], command: list[str], out: Path | None) -> int:
    """Print ``results`` with the command that made them, and write them to ``out``."""
    results["command"] = shlex.join(command + (["--out", str(out)] if out is not None else []))
    text = json.dumps(results, indent=1)
    print(text)
    if out is not None:
        out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
