"""Serving the Lucebox engine through the one supervisor and run state: warm-up before ready,
per-reply numbers from its log lines. The engine needs a GPU, so a stand-in replays the lines
and replies recorded from it on the H100 (support/luceboxfake.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Literal

import httpx
import pytest

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.core.units import GIB
from lucebox.engine.plan.launch import ServerLaunch
from lucebox.engine.plan.lucebox.luceboxlaunch import LuceboxFlags
from lucebox.engine.plan.memory.memory import Plan
from lucebox.engine.plan.memory.sizes import MemoryBytes
from lucebox.engine.plan.speculation.specguard import Decision, SpecGuard
from lucebox.engine.run.calibrate.probing import ProbePace, ProbeSender
from lucebox.engine.run.hang import HangBounds
from lucebox.engine.run.runsetup import RunFacts, SpecSetup
from lucebox.engine.run.sample import Sample
from lucebox.engine.run.serverrun.serverrun import ServerRun
from lucebox.engine.run.supervision.serverevent import ServerEvent
from lucebox.engine.run.supervisor import Supervisor
from support import luceboxfake
from support.ports import free_port

FAKE = Path(luceboxfake.__file__)
FLAGS = LuceboxFlags(max_ctx=4096, max_tokens=512, cache_type="q4_0", prefix_cache_slots=4)


def lucebox_spec(tmp_path: Path) -> ServerLaunch:
    script = tmp_path / "dflash_server"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE} "$@"\n')
    script.chmod(0o755)
    memory = MemoryBytes(0, 0, 0, 0, 0, 0, 8 * GIB)
    plan = Plan(True, 4096, "q4_0", "q4_0", -1, 0, 1, memory, None)
    return ServerLaunch(
        str(script), "/m/qwen35.gguf", plan, "tiny", port=free_port(), kind="lucebox", lucebox=FLAGS
    )


def _guarded_run(supervisor: Supervisor) -> tuple[ServerRun, list[Decision]]:
    """A run of ``supervisor``'s DDTree launch with the guard on, and the decisions it takes."""
    decisions: list[Decision] = []

    def decided(decision: Decision, current: ServerLaunch) -> ServerLaunch | None:
        decisions.append(decision)
        return None

    guard = SpecGuard.for_launch("ddtree", None, on_gpu=True)
    speculation = SpecSetup(guard=guard, on_decision=decided)
    run = ServerRun(resolve_paths(), supervisor, RunFacts(model="tiny", gpu_index=0), speculation)
    return run, decisions


async def _serve(run: ServerRun, port: int, requests: Path) -> tuple[list[str], list[Sample]]:
    """Serve until a sample counts our one reply; the requests seen at ready."""
    seen_at_ready: list[str] = []
    samples: list[Sample] = []
    async for item in run.events():
        if isinstance(item, ServerEvent) and item.kind == "ready":
            seen_at_ready = await asyncio.to_thread(lambda: requests.read_text().splitlines())
            async with httpx.AsyncClient() as client:
                reply = await client.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 256},
                )
            assert reply.json()["usage"]["completion_tokens"] == 256
        elif isinstance(item, Sample) and item.requests_finished_total >= 1:
            samples.append(item)
            run.stop()
    return seen_at_ready, samples


async def test_warm_up_before_ready_then_replies_from_the_log(tmp_path, monkeypatch):
    requests = tmp_path / "requests.txt"
    monkeypatch.setenv("FAKE_REQUESTS", str(requests))
    spec = lucebox_spec(tmp_path)
    supervisor = Supervisor(spec, tmp_path / "engine.log", ready_timeout_s=20)
    run = ServerRun(resolve_paths(), supervisor, RunFacts(model="tiny", gpu_index=0))
    async with asyncio.timeout(60):
        seen_at_ready, samples = await _serve(run, spec.port, requests)
    argv = json.loads(seen_at_ready[0].removeprefix("ARGV "))
    assert argv[0] == "/m/qwen35.gguf" and argv[argv.index("--host") + 1] == "127.0.0.1"
    # The engine answered the warm-up before lucebox called it ready.
    assert "POST /v1/chat/completions" in seen_at_ready[1:]
    assert "# lucebox: warm-up answered" in (tmp_path / "engine.log").read_text()
    last = samples[-1]
    # Ours alone: the warm-up is lucebox's own request, never counted as a client's.
    assert (last.requests_finished_total, last.decode_tokens_total) == (1, 256)
    assert last.last_decode_tokens_per_s is not None
    # The engine's own rate for the reply: [ar-decode] tokens=256 time=0.328 s speed=781.30
    assert abs(last.last_decode_tokens_per_s - 781.30) < 1


async def _chat_through(url: str, *, stream: bool) -> tuple[int, str]:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "stream": stream}
    async with httpx.AsyncClient(timeout=60) as client:
        reply = await client.post(f"{url}/v1/chat/completions", json=body)
    return reply.status_code, reply.text


async def test_clients_wait_out_a_restart_behind_the_front_and_measuring_sees_them(
    tmp_path, monkeypatch
):
    """A measurement's restart while clients ask: the front holds their requests until the
    engine is ready again (none is answered 502), and the probe sender, which cannot ask the
    Lucebox engine for slots or counters, sees them through the front's queue."""
    monkeypatch.setenv("FAKE_REQUESTS", str(tmp_path / "requests.txt"))
    spec = replace(lucebox_spec(tmp_path), engine_port=free_port())
    supervisor = Supervisor(spec, tmp_path / "engine.log", ready_timeout_s=20)
    run = ServerRun(resolve_paths(), supervisor, RunFacts(model="tiny", gpu_index=0))
    sender: ProbeSender[object] = ProbeSender(ProbePace(1.0, 16))
    readies: list[ServerEvent] = []
    ready = asyncio.Event()

    async def follow() -> None:  # as `lucebox serve` does: the run's events in their own task
        async for item in run.events():
            if isinstance(item, ServerEvent) and item.kind == "ready":
                readies.append(item)
                ready.set()

    async with asyncio.timeout(90), httpx.AsyncClient() as probe_client:
        following = asyncio.create_task(follow())
        await ready.wait()
        # Held requests wait as long as the launch may take to load, from their arrival.
        assert run.front is not None and run.front.spec.engine_wait_s == 20
        assert not await sender._client_seen(probe_client, run, probing=False)
        run.restart()
        # A health check while it restarts waits, as llama-server's own while it loads.
        health = await probe_client.get(f"{run.public_url}/health")
        asks = [_chat_through(run.public_url, stream=s) for s in (False, True, False)]
        held = asyncio.gather(*asks)
        await asyncio.sleep(0.5)  # they reach the front while the engine restarts
        seen_held = [await sender._client_seen(probe_client, run, probing=True)]
        answers = await held
        run.stop()
        await following
    assert len(readies) == 2
    assert health.status_code == 503 and health.json()["error"]["message"] == "Loading model"
    assert health.headers["retry-after"] == "1"
    assert seen_held == [True]
    assert [status for status, _ in answers] == [200, 200, 200]
    assert "data: [DONE]" in answers[1][1]
    # No client was let through to the engine before it was ready again.
    log = (tmp_path / "engine.log").read_text()
    assert log.count("# lucebox: warm-up answered") == 2


class RestartAskedDuringRestore(ServerRun):
    """A run whose first slot restore is where a restart is asked (a restart key, a
    measurement), as one can be while the restore waits on the engine."""

    restarted = False

    async def _slot(self, action: Literal["save", "restore"], *, stopping: bool = True) -> None:
        if action == "restore" and not self.restarted:
            self.restarted = True
            self.restart()
        await super()._slot(action, stopping=stopping)


async def test_the_front_stays_closed_when_a_restart_is_asked_during_the_restore(
    tmp_path, monkeypatch
):
    """Clients would reach an engine on its way out (a 502) if the front opened after a
    restore that a restart overtook; it opens once the next engine is ready."""
    monkeypatch.setenv("FAKE_REQUESTS", str(tmp_path / "requests.txt"))
    spec = replace(lucebox_spec(tmp_path), engine_port=free_port())
    supervisor = Supervisor(spec, tmp_path / "engine.log", ready_timeout_s=20)
    run = RestartAskedDuringRestore(
        resolve_paths(), supervisor, RunFacts(model="tiny", gpu_index=0)
    )
    open_at_ready: list[bool] = []
    async with asyncio.timeout(60):
        async for item in run.events():
            if isinstance(item, ServerEvent) and item.kind == "ready":
                assert run.front is not None
                open_at_ready.append(run.front.gate.is_open)
                if len(open_at_ready) == 2:
                    run.stop()
    assert open_at_ready == [False, True]


async def test_the_speculation_guard_keeps_ddtree_while_its_drafts_are_accepted(
    tmp_path, monkeypatch
):
    """DDTree with an agreeing draft (the engine's lines as the H200 logged them: 45 of 48
    drafted tokens accepted per reply): past the guard's minimum of drafted and decoded tokens
    it decides nothing, and status shows the acceptance. Without the drafted totals in the
    sample it read "drafted nothing" and restarted the engine without its draft."""
    monkeypatch.setenv("FAKE_REQUESTS", str(tmp_path / "requests.txt"))
    spec = replace(
        lucebox_spec(tmp_path),
        draft_path="/m/draft.gguf",
        spec_type="ddtree",
        lucebox=replace(FLAGS, ddtree_budget=22),
    )
    supervisor = Supervisor(spec, tmp_path / "engine.log", ready_timeout_s=20)
    run, decisions = _guarded_run(supervisor)
    replies = 14  # 672 drafted and decoded tokens: past both of the guard's minimums
    last: Sample | None = None
    async with asyncio.timeout(90):
        async for item in run.events():
            if isinstance(item, ServerEvent) and item.kind == "ready":
                async with httpx.AsyncClient() as client:
                    for _ in range(replies):
                        await client.post(
                            f"http://127.0.0.1:{spec.port}/v1/chat/completions",
                            json={"messages": [{"role": "user", "content": "hi"}]},
                        )
            elif isinstance(item, Sample) and item.requests_finished_total >= replies:
                last = item
                run.stop()
    # The warm-up's drafts are lucebox's own: the guard judges the clients' replies alone.
    assert last is not None and last.draft_tokens_total == replies * 48
    assert last.accepted_tokens_total == replies * 45
    assert decisions == []
    assert run.status.spec is not None and run.status.spec.active
    assert run.status.spec.acceptance == pytest.approx(45 / 48)


def _spec_sample(drafted: int, accepted: int) -> Sample:
    return Sample(
        1.0, None, None, None, None, None, None, None, None, 0, slots_busy=0,
        draft_tokens_total=drafted, accepted_tokens_total=accepted,
    )  # fmt: skip


def test_a_restarted_engine_starts_the_guards_window_again(tmp_path):
    """The engine's counters start again with each process: a burst before the new engine's
    first sample can pass the old window's start (23% accepted read as negative), which must
    not switch the draft off. The run's guard path, fed the samples of two engine pids."""
    spec = replace(lucebox_spec(tmp_path), draft_path="/m/draft.gguf", spec_type="ddtree")
    supervisor = Supervisor(spec, tmp_path / "engine.log", ready_timeout_s=20)
    run, decisions = _guarded_run(supervisor)
    run._watch_speculation(_spec_sample(960, 900), [], engine_pid=1001)
    assert (guard := run.spec_watch.guard) is not None and guard.drafted_at_start == 960
    run._watch_speculation(_spec_sample(1300, 300), [], engine_pid=1002)
    supervisor.log.close()
    assert decisions == []
    assert (guard := run.spec_watch.guard) is not None and guard.drafted_at_start == 1300


async def test_an_engine_stopped_before_any_look_saw_its_request_is_a_hang(tmp_path, monkeypatch):
    """On a GPU a short reply is done between two looks, so an engine stopped as a request
    reaches it was never seen busy (on the H200 it stayed stopped, never judged hung): the
    front knows the engine has the request, so the run counts the engine's silence from then,
    kills it at the bound and starts it again, and the front sends the request to it."""
    monkeypatch.setenv("FAKE_REQUESTS", str(tmp_path / "requests.txt"))
    spec = replace(lucebox_spec(tmp_path), engine_port=free_port())
    supervisor = Supervisor(spec, tmp_path / "engine.log", ready_timeout_s=20)
    bounds = HangBounds(prefill_floor_s=3.0, decode_s=3.0)
    run = ServerRun(
        resolve_paths(), supervisor, RunFacts(model="tiny", gpu_index=0, hang_bounds=bounds)
    )
    events: list[ServerEvent] = []
    asking: asyncio.Task[tuple[int, str]] | None = None
    stopped_at = hung_after_s = 0.0
    try:
        async with asyncio.timeout(60):
            async for item in run.events():
                if not isinstance(item, ServerEvent):
                    continue
                events.append(item)
                if item.kind == "exited":
                    hung_after_s = time.monotonic() - stopped_at
                if item.kind != "ready" or item.pid is None:
                    continue
                if asking is not None:
                    asking.add_done_callback(lambda _: run.stop())  # sent again, then the end
                    continue
                os.kill(item.pid, signal.SIGSTOP)
                stopped_at = time.monotonic()
                asking = asyncio.create_task(_chat_through(run.public_url, stream=True))
    finally:
        for event in events:
            if event.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(event.pid, signal.SIGCONT)
    exited = next(e for e in events if e.kind == "exited")
    assert exited.cause is not None and exited.cause.code == "hang", exited
    assert "answered nothing for" in exited.cause.words
    restarted = [e for e in events if e.kind == "ready"]
    assert len(restarted) == 2 and restarted[1].pid != restarted[0].pid
    # The Lucebox engine answers looks while it works: one prefill floor, not three.
    # One floor (3 s) and a look; three floors (9 s) would be llama-server's silent bound.
    assert bounds.prefill_floor_s <= hung_after_s < 8.0
    assert asking is not None
    # Nothing had reached the client: the request went to the engine started again.
    status, text = await asking
    assert status == 200 and "data: [DONE]" in text, text[:300]
