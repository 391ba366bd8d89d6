"""Run state: the one-server lock, the state file `lucebox status` reads, stop and detach, and
the running server itself, with the one way to stop or restart it.

`lucebox status` imports this module and must answer in well under 0.1 s of CPU, so what only
starting or running a server needs (subprocess, asyncio, the supervisor, the sampler and its
HTTP client) is imported inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, TypeVar, get_args

from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.errors import LuceboxError
from lucebox.engine.core.paths import Paths
from lucebox.engine.run.sample import CacheStatus, GpuStatus, PeerStatus, Sample, SpecStatus

if TYPE_CHECKING:
    import asyncio

    from lucebox.engine.machine.gpu import NvmlProvider
    from lucebox.engine.plan.launch import LaunchSpec
    from lucebox.engine.plan.specguard import Decision, SpecGuard
    from lucebox.engine.run.metrics import EngineLog
    from lucebox.engine.run.slots import SlotKey
    from lucebox.engine.run.supervisor import ServerEvent, Supervisor

STATE_NAME = "serve.json"
LOCK_NAME = "serve.lock"
STOP_TIMEOUT_S = 45.0
"""A stop saves the slot (at most 15 s) and gives the engine 15 s to exit."""

_Item = TypeVar("_Item", GpuStatus, PeerStatus)
RunStateName = Literal["starting", "loading", "ready", "restarting", "stopped", "failed"]


class AlreadyServingError(LuceboxError):
    """Another lucebox server runs for this user."""


def state_file(paths: Paths) -> Path:
    return paths.runtime_dir / STATE_NAME


def engine_log(paths: Paths) -> Path:
    return paths.logs_dir / "engine.log"


@dataclass(frozen=True)
class Status:
    """The running server as `lucebox status` reports it (DESIGN.md's status shape)."""

    state: RunStateName
    pid: int | None = None
    """The lucebox process that supervises the engine."""
    url: str | None = None
    model: str | None = None
    started_at: float | None = None
    """Unix time the server started."""
    restarts: int = 0
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
            "sample": self.sample.to_json() if self.sample else None,
            "spec": self.spec.to_json() if self.spec else None,
            "cache": self.cache.to_json() if self.cache else None,
            "engine_pid": self.engine_pid,
            "ctx": self.ctx,
            "log": self.log,
            "webui_url": self.webui_url,
            "gpus": [g.to_json() for g in self.gpus],
            "peers": [p.to_json() for p in self.peers],
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
            engine_pid=whole("engine_pid"),
            ctx=whole("ctx"),
            log=text("log"),
            sample=Sample.from_json(data.get("sample")),
            spec=SpecStatus.from_json(data.get("spec")),
            cache=CacheStatus.from_json(data.get("cache")),
            webui_url=text("webui_url"),
            gpus=_items(GpuStatus.from_json, data.get("gpus")),
            peers=_items(PeerStatus.from_json, data.get("peers")),
        )


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
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            self.handle.close()
            running = current_status(paths)
            raise AlreadyServingError(
                f"lucebox already serves {running.model} at {running.url} (pid {running.pid})",
                hint="`lucebox status` shows it; `lucebox down` stops it",
            ) from exc

    def release(self) -> None:
        self.handle.close()


def start_detached(paths: Paths, serve_args: list[str]) -> tuple[int, Path]:
    """Start `lucebox serve SERVE_ARGS` as a background process of this user; its pid and log."""
    import subprocess

    argv = [sys.executable, "-m", "lucebox.app.cli", "serve", *serve_args]
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
        raise LuceboxError(
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


_STATE_OF_EVENT: dict[str, RunStateName] = {
    "starting": "starting",
    "loading": "loading",
    "ready": "ready",
    "exited": "restarting",
    "restarting": "restarting",
    "gave-up": "failed",
    "stopped": "stopped",
}


def state_of(event: ServerEvent) -> RunStateName:
    return _STATE_OF_EVENT[event.kind]


def planned_spec(spec_type: str | None, reason: str | None) -> SpecStatus | None:
    """Speculation as planned, before the engine says whether it runs; None when none is."""
    if spec_type is None:
        return None
    return SpecStatus(spec_type, None, reason or f"{spec_type} as planned", None, None)


@dataclass
class _Run:
    """What changes while a server runs: its status, last sample and the engine's log facts."""

    status: Status
    sample: Sample | None = None
    logs: dict[int, EngineLog] = field(default_factory=dict)
    """The engine's log facts per engine process, fed line by line by the supervisor."""


class ServerRun:
    """A running server: supervises the engine, samples it once ready, keeps the state file.

    Every stop and restart, whoever asks (quitting the dashboard, `lucebox down`, a restart
    key, the re-plan after running out of memory), goes through :meth:`stop` or
    :meth:`restart`, and every engine stopped on purpose passes :meth:`_engine_stopping`
    first: work that must happen on stop is done there, once.
    """

    def __init__(
        self,
        paths: Paths,
        supervisor: Supervisor,
        *,
        model: str,
        gpu_index: int,
        spec_reason: str | None = None,
        webui_url: str | None = None,
        spec_guard: SpecGuard | None = None,
        spec_asked: bool = False,
        on_spec_decision: Callable[[Decision, LaunchSpec], LaunchSpec | None] | None = None,
        slot_key: SlotKey | None = None,
        peers: tuple[PeerStatus, ...] = (),
    ) -> None:
        from lucebox.engine.plan.launch import url_of

        self.spec_guard = spec_guard
        """Watches the acceptance; None when nothing speculates (or it was switched off)."""
        self.spec_asked = spec_asked
        """The user chose the mode (--spec or model.spec): a guard decision only warns."""
        self.on_spec_decision = on_spec_decision
        self.slot_key = slot_key
        """The saved-slot identity of this launch; None when slots are not saved."""
        self._pending: Decision | None = None
        self._spec_off: SpecStatus | None = None
        """Speculation as planned, switched off by the guard: shown instead of the sampler's."""
        self.paths = paths
        self.supervisor = supervisor
        self.gpu_index = gpu_index
        self.spec_reason = spec_reason
        self.url = url_of(supervisor.spec)
        self._run = _Run(
            Status(
                "starting",
                pid=os.getpid(),
                url=self.url,
                model=model,
                started_at=time.time(),
                ctx=supervisor.spec.plan.ctx,
                log=str(engine_log(paths)),
                spec=planned_spec(supervisor.spec.spec_type, spec_reason),
                webui_url=webui_url,
                peers=peers,
            )
        )
        self._sampling: asyncio.Task[None] | None = None
        supervisor.on_line = self._feed_line
        supervisor.before_stop = self._engine_stopping

    @property
    def status(self) -> Status:
        return self._run.status

    def stop(self) -> None:
        """Stop the engine and end the run (quit, `lucebox down`, SIGINT/SIGTERM)."""
        self.supervisor.stop()

    def restart(self, spec: LaunchSpec | None = None) -> None:
        """Stop the serving engine and start it again, with ``spec`` when given."""
        self.supervisor.restart(spec)

    def _guarded(self, spec: SpecStatus | None) -> SpecStatus | None:
        """The sampler's view of speculation, with the guard's warning when it only warns."""
        pending = self._pending
        if spec is None or pending is None or not self.spec_asked:
            return spec
        return replace(spec, reason=f"{pending.observed}; kept, as --spec asked: it costs speed")

    def _watch_acceptance(self, sample: Sample) -> None:
        """Feed the guard; apply its decision once no request is running (one restart)."""
        guard = self.spec_guard
        if guard is None or sample.draft_tokens_total is None:
            return
        if self._pending is None:
            self.spec_guard, self._pending = guard.judge(
                sample.draft_tokens_total, sample.accepted_tokens_total or 0
            )
        decision = self._pending
        if decision is None or self.spec_asked or self.on_spec_decision is None:
            return
        if sample.slots_busy != 0:
            return  # the engine has no per-request switch: wait for an idle moment
        current = self.supervisor.spec
        self._pending = None
        if decision.action == "off":
            self.spec_guard = None
            self._spec_off = SpecStatus(
                current.spec_type or "", False, decision.reason, decision.acceptance, None
            )
        self.spec_reason = decision.reason
        changed = self.on_spec_decision(decision, current)
        if changed is not None:
            self.restart(changed)

    def _feed_line(self, engine_pid: int, line: str) -> None:
        facts = self._run.logs.get(engine_pid)
        if facts is None:
            # Only the current engine's lines matter: forget an earlier engine's.
            self._run.logs = {engine_pid: (facts := self._engine_log())}
        facts.feed(line)

    def _engine_log(self) -> EngineLog:
        """What reads the engine's lines: llama-server's, or the Lucebox engine's."""
        from lucebox.engine.run.luceboxrun import LuceboxLog
        from lucebox.engine.run.metrics import EngineLog

        return LuceboxLog() if self.supervisor.spec.lucebox is not None else EngineLog()

    async def _engine_stopping(self) -> None:
        """Runs before the supervisor stops a live engine on purpose: sampling ends first,
        then the slot is saved so the next start answers from a warm cache."""
        await self._stop_sampling()
        if self._run.status.state == "ready":
            await self._slot("save")

    async def _slot(self, action: Literal["save", "restore"]) -> None:
        import httpx

        from lucebox.engine.run.slots import restore_slot, save_slot

        spec = self.supervisor.spec
        key = self.slot_key
        if key is None or spec.slot_save_path is None:
            return
        key = replace(key, ctx=spec.plan.ctx, cache_type_k=spec.plan.cache_type_k)
        key = replace(key, cache_type_v=spec.plan.cache_type_v)
        headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
        act = save_slot if action == "save" else restore_slot
        async with httpx.AsyncClient() as client:
            tokens = await act(client, self.url, headers, Path(spec.slot_save_path), key)
        if tokens:
            self.supervisor.log.write(f"# lucebox: slot {action}d ({tokens} tokens)")

    async def _stop_sampling(self) -> None:
        import asyncio

        task, self._sampling = self._sampling, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _save(self) -> None:
        write_status(self.paths, self._run.status)

    async def events(self) -> AsyncIterator[ServerEvent | Sample]:
        """Supervise the engine and sample it once ready; yields both streams as they come.

        Keeps the state file that `lucebox status` reads, and removes it when the run ends.
        """
        import asyncio

        from lucebox.engine.run.supervisor import ServerEvent

        queue: asyncio.Queue[ServerEvent | Sample | None] = asyncio.Queue()

        async def follow_supervisor() -> None:
            try:
                async for event in self.supervisor.events():
                    await queue.put(event)
            finally:
                await queue.put(None)

        supervising = asyncio.create_task(follow_supervisor())
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, ServerEvent):
                    await self._on_event(item, queue)
                self._save()
                yield item
        finally:
            self.supervisor.stop()
            await self._stop_sampling()
            with contextlib.suppress(asyncio.CancelledError):
                await supervising
            state_file(self.paths).unlink(missing_ok=True)

    async def _on_event(
        self, event: ServerEvent, queue: asyncio.Queue[ServerEvent | Sample | None]
    ) -> None:
        import asyncio

        self._run.status = replace(
            self._run.status,
            state=state_of(event),
            restarts=event.restarts,
            engine_pid=event.pid,
            ctx=self.supervisor.spec.plan.ctx,
            peers=self._peers_after(event),
        )
        # An engine that is not ready (or no longer) is not sampled.
        await self._stop_sampling()
        if event.kind == "ready" and event.pid is not None:
            await self._slot("restore")
            self._sampling = asyncio.create_task(self._sample(event.pid, queue))

    def _peers_after(self, event: ServerEvent) -> tuple[PeerStatus, ...]:
        """The peers' state: lost when the engine exited and its RPC server does not answer."""
        from lucebox.engine.run.supervisor import down_peers

        peers = self._run.status.peers
        if event.kind == "ready":
            return tuple(replace(p, state="up") for p in peers)
        if event.kind != "exited" or not peers:
            return peers
        down = set(down_peers(tuple(p.address for p in peers)))
        return tuple(replace(p, state="lost" if p.address in down else "up") for p in peers)

    async def _sample(
        self, engine_pid: int, queue: asyncio.Queue[ServerEvent | Sample | None]
    ) -> None:
        from lucebox.engine.machine import gpu
        from lucebox.engine.run.luceboxrun import LuceboxLog, LuceboxSampler
        from lucebox.engine.run.metrics import Sampler, with_last_rates

        spec = self.supervisor.spec
        provider = gpu.PynvmlProvider()
        try:
            provider.init()
        except gpu.NvmlUnavailableError:
            nvml = None
        else:
            nvml = provider
        facts = self._run.logs.setdefault(engine_pid, self._engine_log())
        options: dict[str, Any] = dict(nvml=nvml, gpu_index=self.gpu_index, api_key=spec.api_key)
        options.update(spec_type=spec.spec_type, spec_reason=self.spec_reason)
        sampler = (
            LuceboxSampler(self.url, engine_pid, facts, **options)
            if isinstance(facts, LuceboxLog)
            else Sampler(self.url, engine_pid, facts, **options)
        )
        try:
            async for sample in sampler.samples():
                await queue.put(sample)
                # Status shows the last known rate, not an idle second's missing one.
                self._run.sample = with_last_rates(self._run.sample, sample)
                self._run.status = replace(
                    self._run.status,
                    gpus=gpu_statuses(nvml) if nvml is not None else (),
                    sample=self._run.sample,
                    spec=self._spec_off or self._guarded(sampler.spec_status()),
                    cache=sampler.cache_status(),
                )
                self._watch_acceptance(sample)
        finally:
            if nvml is not None:
                with contextlib.suppress(gpu.NvmlNotSupportedError, gpu.NvmlUnavailableError):
                    nvml.shutdown()


def gpu_statuses(nvml: NvmlProvider) -> tuple[GpuStatus, ...]:
    """Every NVIDIA GPU's memory and load now (a split engine uses several)."""
    from lucebox.engine.machine.gpu import NvmlNotSupportedError

    found = []
    for index in range(nvml.device_count()):
        try:
            total, _, used = nvml.memory_bytes(index)
        except NvmlNotSupportedError:
            continue
        try:
            util: int | None = nvml.utilization_percent(index)
        except NvmlNotSupportedError:
            util = None
        found.append(GpuStatus(index, used, total, util))
    return tuple(found)
