"""One agent-profile llama-server run in this process, for the conversation test and bench:
the launch (the built CPU engine, a fixed plan, a slot folder) and the run behind the front,
its events consumed until it stops."""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from pathlib import Path
from typing import Any

import httpx

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.core.units import GIB
from lucebox.engine.engines import registry
from lucebox.engine.plan.launch import ServerLaunch
from lucebox.engine.plan.memory.memory import Plan
from lucebox.engine.plan.memory.sizes import MemoryBytes
from lucebox.engine.run.runsetup import RunFacts
from lucebox.engine.run.serverrun.serverrun import ServerRun
from lucebox.engine.run.supervisor import Supervisor
from support.ports import free_port

READY_S = 120.0
NOTE = "Here is a long project note to keep in mind. "
"""A line of an agent's system note, repeated to the prompt size wanted."""


def agent_launch(engine_home: Path, model: Path, slots: Path, ctx: int) -> ServerLaunch:
    """The agent profile of ``model`` on the llama-server built in ``engine_home``."""
    paths = resolve_paths({"LUCEBOX_HOME": str(engine_home)})
    llama = next(e for e in registry.list_engines(paths) if e.kind == "llama-server")
    plan = Plan(True, ctx, "f16", "f16", 0, 0, 1, MemoryBytes(0, 0, 0, 0, 0, 0, 8 * GIB), None)
    return ServerLaunch(
        llama.server_path,
        str(model),
        plan,
        "agent",
        port=free_port(),
        engine_port=free_port(),
        slot_save_path=str(slots),
    )


class Served:
    """One run of the launch in this process, its events consumed until it stops."""

    def __init__(
        self, launch: ServerLaunch, home: Path, log: Path, *, sleep_idle_s: float = 0.0
    ) -> None:
        paths = resolve_paths({"LUCEBOX_HOME": str(home)})
        supervisor = Supervisor(launch, log, ready_timeout_s=READY_S)
        facts = RunFacts(model="agent", gpu_index=0, sleep_idle_s=sleep_idle_s)
        self.run = ServerRun(paths, supervisor, facts)
        self.task = asyncio.create_task(self._consume())

    async def _consume(self) -> None:
        async for _ in self.run.events():
            pass

    async def ready(self, not_pid: int | None = None) -> None:
        """Until a new engine (not ``not_pid``) serves: the front holds requests until the
        slot is restored."""
        for _ in range(int(READY_S / 0.1)):
            status = self.run.status
            if status.state == "ready" and status.engine_pid not in (None, not_pid):
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"the run was not ready: {self.run.status}")

    async def asleep(self) -> None:
        """Until the engine sleeps (``sleep_idle_s`` after the last request)."""
        for _ in range(int(READY_S / 0.1)):
            if self.run.status.state == "sleeping":
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"the run did not sleep: {self.run.status}")

    async def stop(self) -> None:
        self.run.stop()
        await asyncio.wait_for(self.task, 60)


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


def slot_lines(log: Path) -> list[str]:
    """What lucebox wrote in the engine log about saving and restoring the slot."""
    said = log.read_text(errors="replace").splitlines()
    return [line for line in said if line.startswith("# lucebox: slot")]


def write_results(results: dict[str, Any], command: list[str], out: Path | None) -> int:
    """Print ``results`` with the command that made them, and write them to ``out``."""
    results["command"] = shlex.join(command + (["--out", str(out)] if out is not None else []))
    text = json.dumps(results, indent=1)
    print(text)
    if out is not None:
        out.write_text(text + "\n")
    return 0
