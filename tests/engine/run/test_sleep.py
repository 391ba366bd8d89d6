"""Sleep without forgetting: the idle decisions (pure), the watch that applies them, and the
supervisor's planned stop and start with a scripted fake engine."""

from __future__ import annotations

import os
import sys

import pytest

from lucebox.engine.plan.launch import ServerLaunch
from lucebox.engine.run.runstate import Status
from lucebox.engine.run.sleep import SleepStatus, counts_as_activity, idle_since, sleep_due
from lucebox.engine.run.sleepwatch import SleepHooks, SleepWatch
from lucebox.engine.run.supervisor import Supervisor
from support.ports import free_port
from tests.engine.run.test_supervisor import HEALTHY, plan  # noqa: F401 (the fixture)


@pytest.mark.parametrize(
    ("method", "path", "counts"),
    [
        ("POST", "/v1/chat/completions", True),
        ("POST", "/v1/messages", True),
        ("GET", "/props", True),
        ("GET", "/health", False),
        ("GET", "/v1/models", False),
        ("GET", "/models", False),
        ("GET", "/metrics", False),
        ("OPTIONS", "/v1/chat/completions", False),
    ],
)
def test_polls_never_count_as_activity(method, path, counts):
    assert counts_as_activity(method, path) is counts


def test_idle_time_counts_only_while_the_engine_serves_and_nothing_runs():
    assert idle_since(10.0, 50.0, busy=False, serving=True) == 10.0
    assert idle_since(10.0, 50.0, busy=True, serving=True) == 50.0
    assert idle_since(10.0, 50.0, busy=False, serving=False) == 50.0  # loading is not idle


def test_sleep_is_due_after_the_idle_time_and_never_when_off():
    assert not sleep_due(30.0, 100.0, 129.9)
    assert sleep_due(30.0, 100.0, 130.0)
    assert not sleep_due(0.0, 0.0, 1e9)


def test_the_sleep_status_reads_back_from_the_state_file():
    status = Status("sleeping", sleep=SleepStatus(True, 1700000000.5, 300.0))
    again = Status.from_file_json(status.to_file_json())
    assert again is not None and again.sleep == status.sleep and again.state == "sleeping"
    assert SleepStatus.from_json({"asleep": "yes", "since": 1, "idle_s": 1}) is None


class Engine:
    """What the watch asks of a run, as plain values the test sets."""

    def __init__(self) -> None:
        self.busy = False
        self.serving = True
        self.calls: list[str] = []

    def hooks(self) -> SleepHooks:
        return SleepHooks(
            busy=lambda: self.busy,
            serving=lambda: self.serving,
            fall_asleep=lambda: self.calls.append("sleep"),
            wake=lambda: self.calls.append("wake"),
        )


def test_the_watch_sleeps_once_idle_and_a_request_wakes_it_but_a_poll_does_not():
    engine = Engine()
    watch = SleepWatch(10.0, engine.hooks())
    start_s = watch._last_active_s
    engine.busy = True
    watch.step(start_s + 8.0)  # a long request: the idle time starts when it ends
    engine.busy = False
    watch.step(start_s + 17.0)
    assert engine.calls == [] and not watch.status().asleep
    watch.step(start_s + 18.0)
    assert engine.calls == ["sleep"] and watch.status().asleep
    watch.step(start_s + 60.0)  # asleep: no second stop
    watch.saw_request("GET", "/v1/models")
    watch.saw_request("GET", "/health")
    assert engine.calls == ["sleep"] and watch.status().asleep
    watch.saw_request("POST", "/v1/chat/completions")
    assert engine.calls == ["sleep", "wake"] and not watch.status().asleep
    watch.saw_request("POST", "/v1/chat/completions")  # awake: no second start
    assert engine.calls == ["sleep", "wake"]


def test_a_request_in_the_idle_time_starts_it_again(monkeypatch):
    engine = Engine()
    watch = SleepWatch(10.0, engine.hooks())
    clock = [1000.0]
    monkeypatch.setattr("lucebox.engine.run.sleepwatch.time.monotonic", lambda: clock[0])
    watch.saw_request("POST", "/v1/completions")
    clock[0] = 1009.0
    watch.step(clock[0])
    watch.saw_request("POST", "/v1/completions")
    watch.step(1018.0)
    assert engine.calls == []
    watch.step(1019.0)
    assert engine.calls == ["sleep"]


def test_a_restart_while_asleep_leaves_it_awake_with_no_second_start():
    engine = Engine()
    watch = SleepWatch(10.0, engine.hooks())
    watch.step(watch._last_active_s + 11.0)
    watch.restarted()
    watch.saw_request("POST", "/v1/chat/completions")
    assert engine.calls == ["sleep"] and not watch.status().asleep


async def test_a_sleep_stops_the_engine_without_a_crash_and_a_wake_starts_it_again(
    plan,  # noqa: F811 (the fixture)
    tmp_path,
):
    fake = tmp_path / "fake-server"
    fake.write_text(HEALTHY.format(python=sys.executable))
    fake.chmod(0o755)
    spec = ServerLaunch(str(fake), "m.gguf", plan, "t", port=free_port())
    supervisor = Supervisor(spec, tmp_path / "engine.log", ready_timeout_s=10)
    seen = []
    async for event in supervisor.events():
        seen.append(event)
        readies = [e for e in seen if e.kind == "ready"]
        if event.kind == "ready":
            supervisor.sleep() if len(readies) < 3 else supervisor.stop()
        elif event.kind == "sleeping":
            assert supervisor.pid is None
            with pytest.raises(ProcessLookupError):
                os.kill(readies[-1].pid or 0, 0)
            supervisor.wake() if len(readies) == 1 else supervisor.stop()
    assert [e.kind for e in seen] == [
        *("starting", "loading", "ready", "sleeping"),
        *("starting", "loading", "ready", "sleeping", "stopped"),
    ]
    assert (seen[-1].restarts, supervisor.planned_restarts) == (0, 0)  # no crash, no restart
    said = (tmp_path / "engine.log").read_text()
    assert "# lucebox: sleeping:" in said and "# lucebox: waking" in said
    assert "exited" not in said
    # The wake starts the launch that passed its warm-up already: llama-server skips its own.
    starts = [line for line in said.splitlines() if line.startswith("# lucebox: starting")]
    assert ["--no-warmup" in line for line in starts] == [False, True]
    # Nor lucebox's: the request that woke it waits behind whatever runs first.
    assert said.count("fake: POST /completion") == said.count("# lucebox: warm-up answered") == 1


async def test_a_restart_asked_while_asleep_starts_the_engine_at_once(
    plan,  # noqa: F811 (the fixture)
    tmp_path,
):
    fake = tmp_path / "fake-server"
    fake.write_text(HEALTHY.format(python=sys.executable))
    fake.chmod(0o755)
    spec = ServerLaunch(str(fake), "m.gguf", plan, "t", port=free_port())
    supervisor = Supervisor(spec, tmp_path / "engine.log", ready_timeout_s=10)
    seen = []
    async for event in supervisor.events():
        seen.append(event)
        if event.kind == "ready":
            supervisor.sleep() if len(seen) < 4 else supervisor.stop()
        elif event.kind == "sleeping":
            supervisor.restart()
    assert [e.kind for e in seen] == [
        *("starting", "loading", "ready", "sleeping", "restarting"),
        *("starting", "loading", "ready", "stopped"),
    ]
    assert (seen[-1].restarts, supervisor.planned_restarts) == (0, 1)
    said = (tmp_path / "engine.log").read_text()
    assert "--no-warmup" not in said  # a restart warms up
    assert said.count("# lucebox: warm-up answered") == 2
