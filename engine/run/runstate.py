"""Run state: the one-server lock, the state file `lucebox status` reads, stop and detach.

`lucebox status` imports this module and must answer in well under 0.1 s of CPU: it imports no
HTTP client, asyncio or engine code (the running server itself is :mod:`serverrun`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, TypeVar, get_args

from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.errors import RunError
from lucebox.engine.core.paths import Paths
from lucebox.engine.plan.lucebox.kvmodeview import ModesStatus
from lucebox.engine.run.death import EngineDeath
from lucebox.engine.run.sample import (
    CacheStatus,
    EngineStatus,
    GpuStatus,
    KeyUse,
    LanStatus,
    PeerStatus,
    QueueStatus,
    Sample,
    SamplingStatus,
    SideStatus,
    SpecStatus,
)
from lucebox.engine.run.servedsetmodels import ModelStatus
from lucebox.engine.run.sleep import SleepStatus

STATE_NAME = "serve.json"
STOP_RECORD_NAME = "last-slot-save.json"
"""How the last save of the engine's slot went, by the lucebox process that made it: it outlives
the state file, so `lucebox down` can say a stop's save failed."""
LOCK_NAME = "serve.lock"
STOP_TIMEOUT_S = 45.0
"""A stop saves the slot (at most 15 s) and gives the engine 15 s to exit."""
LOCK_POLL_S = 0.2

_Item = TypeVar("_Item", GpuStatus, PeerStatus, ModelStatus, KeyUse, SideStatus)
RunStateName = Literal[
    "starting", "loading", "ready", "restarting", "sleeping", "stopped", "failed"
]


class AlreadyServingError(RunError):
    """Another lucebox server runs for this user."""


def state_file(paths: Paths) -> Path:
    return paths.runtime_dir / STATE_NAME


def engine_log(paths: Paths) -> Path:
    return paths.logs_dir / "engine.log"


@dataclass(frozen=True)
class Status:
    """The running server as `lucebox status` reports it (the status shape of docs/contracts.md)."""

    state: RunStateName
    pid: int | None = None
    """The lucebox process that supervises the engine."""
    url: str | None = None
    model: str | None = None
    started_at: float | None = None
    """Unix time the server started."""
    restarts: int = 0
    """Restarts after the engine died."""
    planned_restarts: int = 0
    """Restarts lucebox asked for itself (calibration trials, the speculation guard)."""
    engine_pid: int | None = None
    ctx: int | None = None
    """The context the engine serves now (a re-plan after running out of memory lowers it)."""
    log: str | None = None
    sample: Sample | None = None
    spec: SpecStatus | None = None
    """None when no speculation was planned."""
    cache: CacheStatus | None = None
    webui_url: str | None = None
    """Where the engine's own chat page is, when the engine serves one."""
    gpus: tuple[GpuStatus, ...] = ()
    peers: tuple[PeerStatus, ...] = ()
    models: tuple[ModelStatus, ...] = ()
    """The models of a served set (the router's); empty for one model."""
    vision: str | None = None
    """The projector the engine serves images with (``--mmproj``); None: text only."""
    cause: EngineDeath | None = None
    """Why the engine last died, and the next step; None until it has. It stays once the
    engine serves again, so a restart count has its reason."""
    queue: QueueStatus | None = None
    """lucebox's front's queue of requests for the engine; None without a front."""
    kv_modes: ModesStatus | None = None
    """A long-context Lucebox launch's modes as measured on this card; None elsewhere."""
    engine: EngineStatus | None = None
    """The engine kind serving now and what chose it; None for a served set's router."""
    lan: LanStatus | None = None
    """How the LAN reaches the server; None while it serves this PC alone."""
    keys: tuple[KeyUse, ...] = ()
    """What each key used since the start: every person's, and server.api_key's."""
    sampling: SamplingStatus | None = None
    """The sampling the front's generation requests got; None without a front."""
    sleep: SleepStatus | None = None
    """Whether the engine sleeps and since when; None when it never sleeps
    (``server.sleep_idle_s`` 0)."""
    sides: tuple[SideStatus, ...] = ()
    """The embedding and reranker models beside the chat engine; empty: none."""

    def uptime_s(self, now_s: float | None = None) -> float:
        if self.started_at is None:
            return 0.0
        return round((time.time() if now_s is None else now_s) - self.started_at, 1)

    def to_json(self, now_s: float | None = None) -> dict[str, Any]:
        return {
            "state": self.state,
            "pid": self.pid,
            "url": self.url,
            "model": self.model,
            "uptime_s": self.uptime_s(now_s),
            "restarts": self.restarts,
            "planned_restarts": self.planned_restarts,
            "sample": self.sample.to_json() if self.sample else None,
            "spec": self.spec.to_json() if self.spec else None,
            "cache": self.cache.to_json() if self.cache else None,
            "engine_pid": self.engine_pid,
            "ctx": self.ctx,
            "log": self.log,
            "webui_url": self.webui_url,
            "gpus": [g.to_json() for g in self.gpus],
            "peers": [p.to_json() for p in self.peers],
            "models": [m.to_json() for m in self.models],
            "cause": self.cause.to_json() if self.cause else None,
            "vision": {"served": self.vision is not None, "projector": self.vision},
            "queue": self.queue.to_json() if self.queue else None,
            "users": self.queue.users_json() if self.queue else None,
            "kv_modes": self.kv_modes.to_json() if self.kv_modes else None,
            "engine": self.engine.to_json() if self.engine else None,
            "lan": self.lan.to_json() if self.lan else None,
            "keys": [k.to_json() for k in self.keys],
            "sampling": self.sampling.to_json() if self.sampling else None,
            "sleep": self.sleep.to_json() if self.sleep else None,
            "side_models": [s.to_json() for s in self.sides],
        }

    def to_file_json(self) -> dict[str, Any]:
        """What the state file holds: the status plus its start time."""
        return {**self.to_json(), "started_at": self.started_at}

    @classmethod
    def from_file_json(cls, data: Any) -> Status | None:
        """The status a state file holds; None when it is not one."""
        if not isinstance(data, dict) or data.get("state") not in get_args(RunStateName):
            return None

        def whole(key: str) -> int | None:
            value = data.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        def text(key: str) -> str | None:
            value = data.get(key)
            return value if isinstance(value, str) else None

        started_at = data.get("started_at")
        return cls(
            state=data["state"],
            pid=whole("pid"),
            url=text("url"),
            model=text("model"),
            started_at=float(started_at) if isinstance(started_at, int | float) else None,
            restarts=whole("restarts") or 0,
            planned_restarts=whole("planned_restarts") or 0,
            engine_pid=whole("engine_pid"),
            ctx=whole("ctx"),
            log=text("log"),
            sample=Sample.from_json(data.get("sample")),
            spec=SpecStatus.from_json(data.get("spec")),
            cache=CacheStatus.from_json(data.get("cache")),
            webui_url=text("webui_url"),
            gpus=_items(GpuStatus.from_json, data.get("gpus")),
            peers=_items(PeerStatus.from_json, data.get("peers")),
            models=_items(ModelStatus.from_json, data.get("models")),
            cause=EngineDeath.from_json(data.get("cause")),
            vision=text_of(data.get("vision"), "projector"),
            queue=QueueStatus.from_json(data.get("queue")),
            kv_modes=ModesStatus.from_json(data.get("kv_modes")),
            engine=EngineStatus.from_json(data.get("engine")),
            lan=LanStatus.from_json(data.get("lan")),
            keys=_items(KeyUse.from_json, data.get("keys")),
            sampling=SamplingStatus.from_json(data.get("sampling")),
            sleep=SleepStatus.from_json(data.get("sleep")),
            sides=_items(SideStatus.from_json, data.get("side_models")),
        )


def text_of(data: Any, key: str) -> str | None:
    """``data[key]`` when ``data`` is an object and that is a string."""
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def _items(read: Callable[[Any], _Item | None], data: Any) -> tuple[_Item, ...]:
    found = [read(item) for item in data] if isinstance(data, list) else []
    return tuple(item for item in found if item is not None)


STOPPED = Status("stopped")


def write_status(paths: Paths, status: Status) -> None:
    """Replace the state file at once; it is rewritten every second, so no sync to disk."""
    paths.ensure(paths.runtime_dir)
    write_text_atomic(state_file(paths), json.dumps(status.to_file_json()), durable=False)


def read_status(paths: Paths) -> Status | None:
    """What the state file says, whether or not its server still lives."""
    try:
        data = json.loads(state_file(paths).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return Status.from_file_json(data)


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_slot_save(paths: Paths, failure: str | None) -> None:
    """Record how this process's last slot save went (None: it saved)."""
    paths.ensure(paths.runtime_dir)
    record = {"pid": os.getpid(), "failure": failure, "at_s": round(time.time(), 1)}
    write_text_atomic(paths.runtime_dir / STOP_RECORD_NAME, json.dumps(record), durable=False)


def slot_save_failure(paths: Paths, pid: int) -> str | None:
    """Why the last slot save of lucebox process ``pid`` failed; None when it saved, or when
    that process made none."""
    try:
        record = json.loads((paths.runtime_dir / STOP_RECORD_NAME).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("pid") != pid:
        return None
    failure = record.get("failure")
    return failure if isinstance(failure, str) else None


def current_status(paths: Paths) -> Status:
    """The running server's status; "stopped" when no lucebox server is alive."""
    status = read_status(paths)
    if status is None or not pid_alive(status.pid):
        return STOPPED
    return status


class ServeLock:
    """One lucebox server per user: held for as long as a server (headless or TUI) runs."""

    def __init__(self, paths: Paths) -> None:
        folder = paths.ensure(paths.runtime_dir)
        self.handle: IO[str] = (folder / LOCK_NAME).open("a+")
        deadline_s = time.monotonic() + STOP_TIMEOUT_S
        while True:
            try:
                fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError as exc:
                running = current_status(paths)
                # A server that already removed its status is on its way out: wait for it.
                if running.state == "stopped" and time.monotonic() < deadline_s:
                    time.sleep(LOCK_POLL_S)
                    continue
                self.handle.close()
                if running.state == "stopped":
                    raise AlreadyServingError(
                        f"another lucebox server did not finish stopping within "
                        f"{STOP_TIMEOUT_S:.0f} s",
                        hint="`lucebox down` stops it; then start this one again",
                    ) from exc
                raise AlreadyServingError(
                    f"lucebox already serves {running.model} at {running.url} (pid {running.pid})",
                    hint="`lucebox status` shows it; `lucebox down` stops it",
                ) from exc

    def release(self) -> None:
        self.handle.close()


def start_detached(paths: Paths, serve_args: list[str]) -> tuple[int, Path]:
    """Start `lucebox serve SERVE_ARGS` as a background process of this user; its pid and log."""
    import subprocess

    from lucebox.engine.core.command import cli_argv

    argv = cli_argv("serve", *serve_args)
    log = paths.ensure(paths.logs_dir) / "serve.log"
    with log.open("a") as handle:
        proc = subprocess.Popen(
            argv,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return proc.pid, log


def stop_server(paths: Paths, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
    """Ask the running lucebox server to stop and wait for it; its pid, or None if none ran.

    The server's SIGTERM handler calls :meth:`ServerRun.stop`, the same path as quitting.
    """
    pid = current_status(paths).pid
    if pid is None:
        return None
    if _lock_is_free(paths):
        # The server holds the lock while it runs: a state file without it was left by a
        # lucebox that was killed, and its pid may belong to another program by now.
        state_file(paths).unlink(missing_ok=True)
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.1)
    if pid_alive(pid):
        raise RunError(
            f"lucebox (pid {pid}) did not stop within {timeout_s:.0f} s",
            hint=f"`kill {pid}` again, or `kill -9 {pid}` (its engine dies with it)",
        )
    return pid


def _lock_is_free(paths: Paths) -> bool:
    try:
        with (paths.runtime_dir / LOCK_NAME).open("a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(handle, fcntl.LOCK_UN)
            return True
    except OSError:
        return False
