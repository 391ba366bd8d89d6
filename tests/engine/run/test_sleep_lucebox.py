"""The Lucebox engine sleeps and wakes through the whole run: it has no slot to save, so a
sleep is a stop and the wake a start of the same launch (the engine needs a GPU: the
recorded-contract stand-in serves, support/luceboxfake.py)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import httpx

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.run.runsetup import RunFacts
from lucebox.engine.run.serverrun.serverrun import ServerRun
from lucebox.engine.run.supervision.serverevent import ServerEvent
from lucebox.engine.run.supervisor import Supervisor
from support.ports import free_port
from tests.conftest import alive
from tests.engine.run.test_luceboxserve import lucebox_spec


async def _until(predicate, timeout_s: float) -> None:
    for _ in range(int(timeout_s / 0.1)):
        if predicate():
            return
        await asyncio.sleep(0.1)
    raise AssertionError("timed out")


async def test_the_lucebox_engine_sleeps_once_idle_and_a_request_wakes_it(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_REQUESTS", str(tmp_path / "requests.txt"))
    spec = replace(lucebox_spec(tmp_path), engine_port=free_port())
    supervisor = Supervisor(spec, tmp_path / "engine.log", ready_timeout_s=20)
    facts = RunFacts(model="tiny", gpu_index=0, sleep_idle_s=1.0)
    run = ServerRun(resolve_paths(), supervisor, facts)
    kinds: list[str] = []

    async def follow() -> None:
        async for item in run.events():
            if isinstance(item, ServerEvent):
                kinds.append(item.kind)

    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
    async with asyncio.timeout(90), httpx.AsyncClient(timeout=60) as client:
        following = asyncio.create_task(follow())
        await _until(lambda: run.status.state == "ready", 30)
        first_pid = run.status.engine_pid
        await _until(lambda: run.status.state == "sleeping", 10)
        assert run.status.engine_pid is None and first_pid is not None and not alive(first_pid)
        models = await client.get(f"{run.public_url}/v1/models")
        await asyncio.sleep(1.0)
        still = run.status.state
        reply = await client.post(f"{run.public_url}/v1/chat/completions", json=body)
        woken = run.status
        run.stop()
        await following
    assert models.status_code == 200 and still == "sleeping"
    assert reply.status_code == 200, reply.text
    assert woken.state == "ready" and woken.engine_pid not in (None, first_pid)
    assert woken.sleep is not None and not woken.sleep.asleep
    assert (woken.restarts, woken.planned_restarts) == (0, 0)
    assert kinds == [
        *("starting", "loading", "ready", "sleeping"),
        *("starting", "loading", "ready", "stopped"),
    ]
