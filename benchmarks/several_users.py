"""Benchmark: four people chatting at once with the N-user plan against today's one slot, and
the agent's warm turn before and after them (issue 59).

The built CPU llama-server of the test cache serves SmolLM2-135M-Instruct behind lucebox's
front, in this process, launched as the one planner plans it for this PC with ``users`` 1 and
4 (``-np 4 --kv-unified``; speculation off in both). In each: an agent conversation of ~2,000
tokens is made warm, four users each send a streamed chat at the same moment, and the agent
sends its next turn. Measured: each user's time to the
first token (from sending, queueing included) and decode tokens/s, the tokens all four got per
second of wall time, the most engine slots busy at once (status's ``users``), and the agent's
time to the first token of a one-token turn (warm before, after the four, and after a stop
and start of the run, its slot saved and restored) with the tokens the engine read for it.

    .venv/bin/python -m benchmarks several_users [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.machine.budget import budget_for
from lucebox.engine.machine.config import Settings
from lucebox.engine.machine.gpu import probe_gpus
from lucebox.engine.plan.launch import ServerLaunch
from lucebox.engine.plan.options import ServeOptions, resolve
from lucebox.engine.plan.planner import find_installs, plan_launch
from support.agentrun import NOTE, Served, slot_lines, turn, write_results
from support.ports import free_port
from support.realmodels import engine_home, smol_model

CTX = 8192
USERS = 4
AGENT_REPEATS = 170
"""SmolLM2 reads the note at about a word a token: ~2,000 tokens of agent prompt (a shared
2-core PC reads it in minutes)."""
USER_TOKENS = 32
TOPICS = ("bread", "bicycles", "tides", "chess")


def planned_launch(users: int, slots: Path) -> tuple[ServerLaunch, dict[str, Any]]:
    """The launch the one planner makes for SmolLM2 on this PC with ``users``, on free ports."""
    paths = resolve_paths({"LUCEBOX_HOME": str(engine_home())})
    options = ServeOptions(model=str(smol_model()), ctx=CTX, users=users, spec="off")
    probe = probe_gpus()
    launch = plan_launch(
        paths, options, resolved=resolve(options, Settings()), budget=budget_for(probe),
        installs=find_installs(paths, probe),
    )  # fmt: skip
    assert launch.users is not None and launch.users.slots == users, launch.users
    server = replace(
        launch.server, port=free_port(), engine_port=free_port(), slot_save_path=str(slots)
    )
    return server, {"argv": launch.argv, "users": launch.users.to_json()}


async def user_chat(url: str, topic: str) -> dict[str, Any]:
    """One person's streamed chat: time to the first token (queueing included) and decode."""
    body = {
        "messages": [{"role": "user", "content": f"Tell me about {topic}, at length."}],
        "max_tokens": USER_TOKENS,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    started = time.monotonic()
    stamps: list[float] = []
    async with (
        httpx.AsyncClient(timeout=600) as client,
        client.stream("POST", f"{url}/v1/chat/completions", json=body) as reply,
    ):
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if not line.startswith("data: {"):
                continue  # the front's ": queued, position N" notes and the [DONE]
            delta = json.loads(line[6:])["choices"][0].get("delta", {})
            if delta.get("content"):
                stamps.append(time.monotonic())
    ended = time.monotonic()
    decode_s = stamps[-1] - stamps[0] if len(stamps) > 1 else 0.0
    return {
        "ttft_s": round(stamps[0] - started, 3) if stamps else None,
        "tokens": len(stamps),
        "decode_tok_s": round((len(stamps) - 1) / decode_s, 1) if decode_s else None,
        "wall_s": round(ended - started, 3),
    }


async def busiest(served: Served, done: asyncio.Event) -> int:
    """The most engine slots busy at once while the users chat (status's ``users``)."""
    most = 0
    front = served.run.front
    while front is not None and not done.is_set():
        most = max(most, front.queue_status().users_json()["slots_busy"])
        await asyncio.sleep(0.02)
    return most


async def measure(users: int, folder: Path) -> dict[str, Any]:
    slots = folder / "slots"
    slots.mkdir()
    launch, planned = planned_launch(users, slots)
    found: dict[str, Any] = {"plan": planned}
    messages = [{"role": "system", "content": "You are a coding agent. " + NOTE * AGENT_REPEATS}]
    served = Served(launch, folder / "home", folder / "engine.log")
    try:
        await served.ready()
        url = served.run.public_url
        found["agent_first"] = await turn(url, messages, "What is the note about?", 12)
        print(f"users={users}: the agent's conversation is warm", file=sys.stderr)
        found["agent_warm_before"] = await turn(url, messages, "tool result: ok", 1)
        done = asyncio.Event()
        watch = asyncio.create_task(busiest(served, done))
        started = time.monotonic()
        chats = await asyncio.gather(*(user_chat(url, topic) for topic in TOPICS[:USERS]))
        wall_s = time.monotonic() - started
        done.set()
        found["users"] = chats
        found["users_wall_s"] = round(wall_s, 3)
        found["aggregate_tok_s"] = round(sum(c["tokens"] for c in chats) / wall_s, 1)
        found["slots_busy_most"] = await watch
        print(f"users={users}: {USERS} users served", file=sys.stderr)
        found["agent_warm_after"] = await turn(url, messages, "tool result: 3 files changed", 1)
    finally:
        await served.stop()
    # The agent's slot is saved on the stop and restored into slot 0 on the start.
    served = Served(launch, folder / "home", folder / "engine.log")
    try:
        await served.ready()
        url = served.run.public_url
        found["agent_after_restart"] = await turn(url, messages, "tool result: build passed", 1)
    finally:
        await served.stop()
    found["lucebox_slot_lines"] = slot_lines(folder / "engine.log")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {"model": smol_model().name, "ctx": CTX, "cores": os.cpu_count()}
    for users in (1, USERS):
        with tempfile.TemporaryDirectory(prefix="lucebox-users-") as folder:
            results[f"users={users}"] = asyncio.run(measure(users, Path(folder)))
    return write_results(results, ["python", "-m", "benchmarks", "several_users"], args.out)


if __name__ == "__main__":
    sys.exit(main())
