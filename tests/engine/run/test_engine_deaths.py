"""Deaths of the real llama-server named end to end: the built CPU engine serving SmolLM2 in a
home of its own, killed by real signals; what `status --json`, the events and the engine log say.

The rebuild after an illegal instruction is injected (it returns the launch on the same binary):
CI builds no second engine, and the CPU here runs the one built.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import httpx
import psutil
import pytest

from lucebox.engine import pipeline, runstart
from lucebox.engine.core.paths import Paths, resolve_paths
from lucebox.engine.engines import cputarget
from lucebox.engine.machine.ports import next_free_port
from lucebox.engine.models.pull import pull_model
from lucebox.engine.plan.launch import ServerLaunch
from lucebox.engine.plan.options import ServeOptions
from lucebox.engine.run import runstate
from lucebox.engine.run.hang import HangBounds
from lucebox.engine.run.runstate import engine_log
from lucebox.engine.run.serverrun.serverrun import ServerRun
from lucebox.engine.run.serverrun.serversampling import HANG_CHECK_S
from lucebox.engine.run.slots import PART_SUFFIX, SlotKey
from lucebox.engine.run.supervision.restartpolicy import RestartPolicy
from lucebox.engine.run.supervision.serverevent import ServerEvent
from lucebox.engine.run.supervisor import (
    Supervisor,
)
from support.ports import free_port
from support.realmodels import smol_model
from support.smolserver import private_engine_home
from tests.conftest import alive, run_lucebox

pytestmark = pytest.mark.slow


@pytest.fixture
def home(built_engine_home, tmp_path, monkeypatch) -> Paths:
    folder = private_engine_home(tmp_path / "home")
    monkeypatch.setenv("LUCEBOX_HOME", str(folder))
    return resolve_paths({"LUCEBOX_HOME": str(folder)})


def status_json() -> dict:
    """What `lucebox status --json` prints for the test's home, asked as a user would."""
    done = run_lucebox("status", "--json")
    assert done.returncode == 0, done.stderr
    document: dict = json.loads(done.stdout)
    return document


def serve(paths: Paths, model: Path) -> tuple[pipeline.Prepared, Supervisor]:
    options = ServeOptions(model=str(model), ctx=2048, port=free_port(), cache="off")
    prepared = pipeline.prepare(paths, options, lambda event: None)
    supervisor = runstart.new_supervisor(paths, prepared)
    supervisor.policy = RestartPolicy(first_backoff_s=0.1)
    return prepared, supervisor


async def server_events(run: ServerRun) -> AsyncIterator[ServerEvent]:
    async for item in run.events():
        if isinstance(item, ServerEvent):
            yield item


async def test_an_illegal_instruction_rebuilds_for_the_baseline_below_once_then_gives_up(home):
    prepared, supervisor = serve(home, smol_model())
    died_on = supervisor.cpu_target
    below = cputarget.below(died_on)
    assert below is not None and supervisor.rebuild_for_cpu is not None
    rebuilt: list[str] = []

    def rebuild(spec: ServerLaunch, target: str, cancel: threading.Event) -> ServerLaunch:
        rebuilt.append(target)
        return spec

    supervisor.rebuild_for_cpu = rebuild
    run = runstart.server_run(home, prepared, supervisor)
    events: list[ServerEvent] = []
    after_rebuild: dict = {}
    async for event in server_events(run):
        events.append(event)
        if event.kind != "ready" or event.pid is None:
            continue
        if rebuilt:
            after_rebuild = status_json()
        os.kill(event.pid, signal.SIGILL)  # what the CPU sends for an instruction it lacks
    kinds = [e.kind for e in events]
    assert kinds.count("ready") == 2 and kinds[-1] == "gave-up"
    assert rebuilt == [below.name]  # once, for the next baseline down
    first, second = (e for e in events if e.kind == "exited")
    assert first.cause is not None and first.cause.code == "illegal-instruction"
    assert first.cause.returncode == -signal.SIGILL
    assert f"for {below.name} once, by itself" in first.cause.next_step
    said = [e.message for e in events if e.kind == "restarting"]
    assert said[0].startswith(f"rebuilding the same engine version for {below.name}, once")
    assert said[1] == f"rebuilt for {below.name}: starting it"
    # Serving again on the rebuild, `status` names the death that caused it.
    assert after_rebuild["state"] == "ready" and after_rebuild["restarts"] == 1
    assert after_rebuild["cause"]["code"] == "illegal-instruction"
    assert after_rebuild["cause"]["returncode"] == -signal.SIGILL
    assert "this CPU does not run" in after_rebuild["cause"]["words"]
    # The rebuild died the same way: no second rebuild, and the give-up names the cause.
    assert second.cause is not None and "does not again" in second.cause.next_step
    gave_up = events[-1]
    assert gave_up.message.startswith("gave up after 2 crashes in 600 s: illegal-instruction:")
    assert f"its build for {below.name} uses an instruction" in gave_up.message
    assert "see the log" not in gave_up.message
    log = engine_log(home).read_text()
    assert "# lucebox: exited: engine exited (-4): the engine died of an illegal instruction" in log
    assert f"# lucebox: gave-up: {gave_up.message}" in log


async def test_kill_9_and_a_segfault_of_the_engine_are_named_with_the_next_step(home):
    prepared, supervisor = serve(home, smol_model())
    run = runstart.server_run(home, prepared, supervisor)
    seen: list[dict] = []
    signals = [signal.SIGKILL, signal.SIGSEGV]
    async for event in server_events(run):
        if event.kind != "ready" or event.pid is None:
            continue
        if event.restarts:
            seen.append(status_json())  # serving again: why it died the last time
        if len(seen) == len(signals):
            run.stop()
        else:
            os.kill(event.pid, signals[len(seen)])
    killed, crashed = (s["cause"] for s in seen)
    assert killed["code"] == "killed" and killed["returncode"] == -signal.SIGKILL
    # The kernel's out-of-memory counter did not move: this kill -9 was a user's, not the OOM
    # killer's, and the reading says so.
    assert "by another program or a user" in killed["words"]
    assert "not by the kernel's out-of-memory killer" in killed["words"]
    assert crashed["code"] == "segfault" and crashed["returncode"] == -signal.SIGSEGV
    assert crashed["last_lines"] and crashed["words"].endswith(crashed["last_lines"][-1])
    assert seen[-1]["restarts"] == 2 and seen[-1]["state"] == "ready"


async def test_a_model_file_truncated_under_the_engine_is_refused_until_verified(home, tmp_path):
    model = tmp_path / "models" / "smol-copy.gguf"
    model.parent.mkdir()
    shutil.copy(smol_model(), model)
    name = pull_model(home, str(model)).name
    prepared, supervisor = serve(home, model)
    assert supervisor.model_name == name
    run = runstart.server_run(home, prepared, supervisor)
    events: list[ServerEvent] = []
    async for event in server_events(run):
        events.append(event)
        if event.kind == "ready" and event.pid is not None:
            # lucebox's front answers in this loop: the client asks from a thread.
            await asyncio.to_thread(truncate_and_ask, model, prepared.server)
    kinds = [e.kind for e in events]
    assert kinds.count("starting") == 1 and kinds[-1] == "gave-up"  # not restarted
    death = events[-1].cause
    assert death is not None and death.code == "bus-error"
    assert f"{model} changed on disk since the engine started (98,362,432 ->" in death.words
    assert f"run `lucebox models verify {name}`" in death.next_step
    assert "bus-error" in events[-1].message and "models verify" in events[-1].message


def truncate_and_ask(model: Path, spec: ServerLaunch) -> None:
    """Cut the mapped model file short, then ask for a reply: the engine reads weights past
    the new end of the file and the kernel sends it a real SIGBUS."""
    with model.open("r+b") as handle:
        handle.truncate(model.stat().st_size // 4)
    body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
    # lucebox's front answers with an error of its own when the engine dies under the request
    # (a connection error when it is cut before answering).
    try:
        reply = httpx.post(
            f"http://127.0.0.1:{spec.port}/v1/chat/completions", json=body, timeout=60
        )
    except httpx.HTTPError:
        return
    assert reply.status_code >= 500, reply.text


TOKENS_BEFORE_STOP = 20
"""Streamed lines received before the engine is stopped: it is decoding by then."""


class LongRequest(threading.Thread):
    """A long streamed generation from a client that waits as long as it takes: what it
    received, and how its request ended."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.decoding = threading.Event()
        self.ended: BaseException | str | None = None
        self.last_lines: list[str] = []

    def run(self) -> None:
        body = {
            "messages": [{"role": "user", "content": "Count from one to ten thousand."}],
            "max_tokens": 100_000,
            "stream": True,
            # The engine's own switch: an end-of-text token would finish the reply before the
            # stop, and a stopped engine with no request running is no hang.
            "ignore_eos": True,
        }
        url = f"http://127.0.0.1:{self.port}/v1/chat/completions"
        try:
            with httpx.stream("POST", url, json=body, timeout=None) as reply:
                for count, line in enumerate(reply.iter_lines()):
                    if count == TOKENS_BEFORE_STOP:
                        self.decoding.set()
                    if line:
                        self.last_lines = [*self.last_lines[-1:], line]
            self.ended = "finished"
        except httpx.HTTPError as exc:
            self.ended = exc
        self.decoding.set()


async def test_a_stopped_engine_mid_request_is_a_hang_restarted_and_the_client_is_let_go(home):
    prepared, supervisor = serve(home, smol_model())
    run = runstart.server_run(home, prepared, supervisor)
    run.facts = replace(run.facts, hang_bounds=HangBounds(prefill_floor_s=3.0, decode_s=3.0))
    events: list[ServerEvent] = []
    client: LongRequest | None = None
    stopped_at = hung_after_s = 0.0
    after: dict = {}
    try:
        # A hang never named fails here instead of holding the whole suite.
        async with asyncio.timeout(240):
            async for event in server_events(run):
                events.append(event)
                if event.kind == "exited":
                    hung_after_s = time.monotonic() - stopped_at
                if event.kind != "ready" or event.pid is None:
                    continue
                if client is not None:
                    after = status_json()
                    run.stop()
                    continue
                client = LongRequest(prepared.server.port)
                client.start()
                assert await asyncio.to_thread(client.decoding.wait, 60)
                await asyncio.sleep(2.5)  # the run's samples have seen it decode
                os.kill(event.pid, signal.SIGSTOP)  # alive, holding the connection, no tokens
                stopped_at = time.monotonic()
    finally:
        for event in events:
            if event.pid is not None and alive(event.pid):
                os.kill(event.pid, signal.SIGCONT)
    exited = next(e for e in events if e.kind == "exited")
    assert exited.cause is not None and exited.cause.code == "hang"
    assert "no token for" in exited.cause.words and "ended with an error" in exited.cause.words
    assert after["state"] == "ready" and after["restarts"] == 1
    assert after["cause"]["code"] == "hang" and after["cause"]["next_step"]
    # The waiting client was let go when the engine was killed, within the bound and a sample.
    assert client is not None
    client.join(30)
    # The front is in the request path: the stream ends with an error event that says why
    # (both SDKs raise on it), not a connection closed under the client.
    assert client.ended == "finished", client.ended
    event_line, data = client.last_lines
    assert event_line == "event: error", client.last_lines
    error = json.loads(data.removeprefix("data: "))
    assert error["type"] == "error" and error["error"]["code"] == 502
    assert "stopped in the middle of this reply" in error["error"]["message"]
    # Named after the bound (counted from the last look that saw progress, up to a sample
    # before the stop), within a sample's timeout and the kill.
    assert 3.0 - HANG_CHECK_S <= hung_after_s < 3.0 + 6.0
    assert "# lucebox: hang: a request got no token for" in engine_log(home).read_text()


def test_a_port_taken_before_serve_names_the_holder_and_a_free_port_without_a_loop(home):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = run_lucebox("serve", "--model", str(smol_model()), "--port", str(port))
        free = next_free_port("127.0.0.1", port)
    assert done.returncode == 1, done.stderr
    me = f"{psutil.Process().name()} (pid {os.getpid()})"
    assert free is not None
    said = done.stdout + done.stderr
    assert f"port {port} is held by {me}" in said
    assert f"serve on port {free}, which is free (--port {free})" in said
    # One attempt: no engine started, one give-up, no restart.
    log = engine_log(home).read_text()
    assert "# lucebox: starting" not in log
    assert log.count("# lucebox: gave-up:") == 1 and "restarting" not in log


async def test_a_slot_save_that_fails_is_said_in_the_log_and_in_status(home):
    """The agent cache saves the slot before a planned restart; when the engine cannot write it
    (here a folder stands where its file goes, as a full or read-only disk would refuse it), the
    log and `status --json` say why, instead of the next start silently computing the prompt
    again."""
    options = ServeOptions(model=str(smol_model()), ctx=2048, port=free_port(), cache="agent")
    prepared = pipeline.prepare(home, options, lambda event: None)
    supervisor = runstart.new_supervisor(home, prepared)
    run = runstart.server_run(home, prepared, supervisor)
    in_the_way = home.slots_dir / f"{SlotKey.of(prepared.server).file_name}{PART_SUFFIX}"
    readies = 0
    async for event in server_events(run):
        if event.kind != "ready":
            continue
        readies += 1
        if readies == 1:
            async with httpx.AsyncClient(timeout=120) as client:
                reply = await client.post(
                    f"{event.message.removeprefix('serving at ')}/v1/chat/completions",
                    json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
                )
                assert reply.status_code == 200, reply.text
            in_the_way.mkdir(parents=True)
            run.restart()
            continue
        cache = status_json()["cache"]
        run.stop()
    assert readies == 2
    failure = cache["slot_save_failure"]
    assert failure.startswith("the engine refused the save (") and "no slot is kept" in failure
    assert f"# lucebox: slot save failed: {failure}" in engine_log(home).read_text()
    # The stop's own save failed the same way: the record `lucebox down` reads says so.
    stop_failure = runstate.slot_save_failure(home, os.getpid())
    assert stop_failure is not None and "no slot is kept" in stop_failure
