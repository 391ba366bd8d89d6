"""Supervise llama-server: start it, know when it is ready, bring it back, say why it died.

The engine runs in its own process group with a parent-death signal, so it cannot outlive
lucebox; its output goes to a rotating log file and an in-memory ring for the UI. Events are
an async iterator that the CLI and the TUI both consume.

``events`` is one state machine (start, loading, ready, exit, backoff, give up): one engine's
life is ``_one_engine``, what follows its death ``_after_death``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import os
import signal
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx
import psutil

from lucebox.engine.core.errors import LuceboxError, RunError
from lucebox.engine.core.waits import event_within
from lucebox.engine.engines import cputarget, kinds
from lucebox.engine.machine.ports import down_peers, next_free_port, port_holder
from lucebox.engine.plan.launch import (
    ServerLaunch,
    engine_address,
    engine_environ,
    engine_url,
    server_argv,
    url_of,
)
from lucebox.engine.run import prefixdisk
from lucebox.engine.run.death import (
    REPORT_STEP,
    DeathFacts,
    EngineDeath,
    FileStamp,
    changed_file,
    engine_missing,
    host_ram_terms,
    name_death,
    port_taken,
)
from lucebox.engine.run.deathfacts import file_stamp, oom_kills, oom_kills_since, ram_users
from lucebox.engine.run.kinds.enginerun import engine_run
from lucebox.engine.run.kinds.ownrequests import OwnRequests

EventKind = Literal[
    "starting", "loading", "ready", "exited", "restarting", "sleeping", "gave-up", "stopped"
]
LOG_ROTATE_BYTES = 16 * 1024 * 1024
LOG_KEEP = 3
RING_LINES = 2000
_FINAL: frozenset[EventKind] = frozenset({"gave-up", "stopped"})
"""The events after which :meth:`Supervisor.events` ends."""
STOP_TIMEOUT_S = 15.0
HEALTH_INTERVAL_S = 0.05
"""While loading, the engine answers /health with 503 in well under a millisecond: asking
often costs nothing and lets ready follow the engine closely."""
_PR_SET_PDEATHSIG = 1
DEATH_LINES = 60
"""The engine's last lines read to name its death."""


@dataclass(frozen=True)
class ServerEvent:
    kind: EventKind
    message: str
    pid: int | None = None
    cause: EngineDeath | None = None
    """Why the engine died (or was not started), on exited, restarting after a death and
    gave-up."""
    restarts: int = 0
    ctx: int | None = None
    """The context this engine serves (a re-plan after running out of memory changes it)."""
    planned: bool = False
    """A restart lucebox asked for itself (a calibration's trial, the speculation guard, the
    restart key), not one after a crash."""


class PortInUseError(RunError):
    """The port is held by another program."""


def _crashes(count: int) -> str:
    return f"{count} crash" if count == 1 else f"{count} crashes"


def die_with_parent() -> None:
    # The engine gets SIGKILL when lucebox dies, even by SIGKILL: no orphaned GPU holder.
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class RotatingLog:
    """Append-only log file that rotates at a size, keeping a few old files."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = path.open("a", encoding="utf-8")

    def write(self, line: str) -> None:
        self.handle.write(line + "\n")
        self.handle.flush()
        if self.handle.tell() > LOG_ROTATE_BYTES:
            self.handle.close()
            for index in range(LOG_KEEP - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{index}")
                if older.exists():
                    older.rename(self.path.with_name(f"{self.path.name}.{index + 1}"))
            self.path.rename(self.path.with_name(f"{self.path.name}.1"))
            self.handle = self.path.open("a", encoding="utf-8")

    def close(self) -> None:
        self.handle.close()


@dataclass
class RestartPolicy:
    max_crashes: int = 5
    window_s: float = 600.0
    first_backoff_s: float = 1.0
    max_backoff_s: float = 30.0


class Supervisor:
    """Runs one engine process at a time and reports what happens to it."""

    def __init__(
        self,
        server: ServerLaunch,
        log_path: Path,
        *,
        ready_timeout_s: float,
        policy: RestartPolicy | None = None,
        replan_on_oom: Callable[[ServerLaunch], ServerLaunch | None] | None = None,
    ) -> None:
        self.launch = server
        self.log = RotatingLog(log_path)
        self.ring: deque[str] = deque(maxlen=RING_LINES)
        self.lines_total = 0
        """Lines the engine has written so far; a viewer shows the ring's last new ones."""
        self.ready_timeout_s = ready_timeout_s
        self.policy = policy or RestartPolicy()
        self.replan_on_oom = replan_on_oom
        self.fallback: ServerLaunch | None = None
        """While a launch is only tried (a long-context mode being measured): the one to go
        back to when it dies. Its death is the trial's answer: no re-plan, no backoff, no
        count toward giving up."""
        self.process: asyncio.subprocess.Process | None = None
        self.restarts = 0
        """Restarts after the engine died (a crash, an out-of-memory retry, a rebuild)."""
        self.planned_restarts = 0
        """Restarts lucebox asked for itself: a calibration's trials, the speculation guard."""
        self.started_at = time.time()
        self.on_line: Callable[[int, str], None] | None = None
        """Called with the engine's pid and each line it writes, as it writes it."""
        self.before_stop: Callable[[], Awaitable[None]] | None = None
        """Awaited before a live engine is stopped on purpose (stop, restart, not ready)."""
        self.own_requests = OwnRequests()
        """lucebox's own requests to the engine (its warm-up, the calibrations' probes)."""
        self._stopping = asyncio.Event()
        self._restart_asked = asyncio.Event()
        self._sleep_asked = asyncio.Event()
        self._wake_asked = asyncio.Event()
        self._woken = False
        """The next start is a wake's: the same launch, started before in this run."""
        self._hang_seen = asyncio.Event()
        self._hung_why: str | None = None
        self._restart_spec: ServerLaunch | None = None
        self._crash_times: list[float] = []
        self._oom_retried = False
        self.cpu_target: str | None = None
        """The CPU baseline of the engine build that runs; None for one lucebox did not build."""
        self.rebuild_for_cpu: (
            Callable[[ServerLaunch, str, threading.Event], ServerLaunch] | None
        ) = None
        """Builds the served engine's version again for a lower CPU baseline and returns the
        launch on it (minutes, in a thread; it stops when the event is set); None: an engine
        that dies of an illegal instruction is not rebuilt."""
        self._rebuilt_from: str | None = None
        self._oom_kills_at_start: int | None = None
        self.model_name: str | None = None
        """The served model's name in the store, for the `lucebox models verify` it names."""
        self.after_give_up: Callable[[EngineDeath], str | None] | None = None
        """Told the death the engine gave up with; returns what it did about it (the automatic
        rollback of a new build) for the give-up's message, or None."""

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    async def _pump(self, engine_pid: int, stream: asyncio.StreamReader) -> None:
        while raw := await stream.readline():
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            self.ring.append(line)
            self.lines_total += 1
            self.log.write(line)
            if self.on_line is not None:
                self.on_line(engine_pid, line)

    async def _wait_ready(self, process: asyncio.subprocess.Process, *, woken: bool) -> str | None:
        """None once the engine serves; else why it does not (it exited, it was not ready in
        time, its warm-up failed, a stop was asked for)."""
        url = engine_url(self.launch) + "/health"
        deadline = time.monotonic() + self.ready_timeout_s
        async with httpx.AsyncClient(timeout=2.0) as client:
            while time.monotonic() < deadline and process.returncode is None:
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(url)).status_code == 200:
                        return await self._warmed_up(client, woken=woken)
                if await event_within(self._stopping, HEALTH_INTERVAL_S):
                    return "a stop was asked for"
        return f"it was not ready within {self.ready_timeout_s:.0f} s"

    async def _warmed_up(self, client: httpx.AsyncClient, *, woken: bool) -> str | None:
        """The engine's own warm-up (:meth:`EngineRun.warm_up`) passes before it counts as
        ready, so a failure it provokes comes now, not to a user, and before the ready event,
        on which the run restores the saved slot; what failed, or None."""
        run = engine_run(self.launch.kind)
        if not run.sends_warm_up(self.launch, woken=woken):
            return None  # nothing sent: no own request for the log to claim
        with self.own_requests.sending() as answered:
            failure = await run.warm_up(client, engine_url(self.launch), self.launch)
            if failure is None:
                answered.append(True)
        self.log.write(f"# lucebox: warm-up {'answered' if failure is None else failure}")
        return None if failure is None else f"its warm-up request failed: {failure}"

    async def events(self) -> AsyncIterator[ServerEvent]:
        """Start the engine and keep it up until ``stop`` or a crash loop; yield what happens."""
        try:
            while not self._stopping.is_set():
                last: ServerEvent | None = None
                async for last in self._one_engine():
                    yield last
                if last is None or last.kind in _FINAL:
                    return
        finally:
            if self.process is not None and self.process.returncode is None:
                await self._terminate(self.process)
            self.log.close()

    async def _one_engine(self) -> AsyncIterator[ServerEvent]:
        """One engine process from its start to its end, then what follows it: a restart
        (the last event says ``restarting``), or the end of the run (``gave-up``, ``stopped``)."""
        refused = self._address_taken()
        if refused is not None:
            yield refused
            return
        argv = server_argv(self.launch)
        woken, self._woken = self._woken, False
        if woken:  # the same launch passed its warm-up before it slept
            argv += engine_run(self.launch.kind).wake_argv
        for dropped in prefixdisk.before_start(self.launch):
            self.log.write(f"# lucebox: saved prompt states over budget: removed {dropped}")
        self.log.write(f"# lucebox: starting {' '.join(argv)}")
        launched = self._stamp_files()
        lines_before = self.lines_total
        self._oom_kills_at_start = oom_kills()
        process = await self._spawn(argv)
        if isinstance(process, ServerEvent):
            yield process
            return
        self.process = process
        assert process.stdout is not None
        pump = asyncio.create_task(self._pump(process.pid, process.stdout))
        ctx = self.launch.plan.ctx
        started = f"engine started (pid {process.pid}, ctx {ctx})"
        yield ServerEvent("starting", started, process.pid, restarts=self.restarts, ctx=ctx)
        yield ServerEvent("loading", "loading the model", process.pid, restarts=self.restarts)
        unready = await self._wait_ready(process, woken=woken)
        if unready is None:
            serving = f"serving at {url_of(self.launch)}"
            yield ServerEvent("ready", serving, process.pid, restarts=self.restarts)
            wanted = await self._serve(process)
            if wanted is not None:
                await self._terminate(process)
                await pump
                if wanted == "sleep":
                    async for event in self._asleep():
                        yield event
                    return
                asked, self._restart_spec = self._restart_spec, None
                message = "restarting as asked"
                yield self._relaunch(asked or self.launch, message, process.pid, None, planned=True)
                return
        if self._stopping.is_set():
            await self._terminate(process)
            await pump
            yield ServerEvent("stopped", "engine stopped", process.pid, restarts=self.restarts)
            return
        if process.returncode is None:  # never became ready in time
            await self._terminate(process)
        else:
            unready = None
        await pump
        assert process.returncode is not None
        hung_why, self._hung_why = self._hung_why, None
        self._hang_seen.clear()
        death = self._name_death(process.returncode, lines_before, launched, unready, hung_why)
        async for event in self._after_death(death, process.pid):
            yield event

    def _address_taken(self) -> ServerEvent | None:
        """The give-up when another program holds the engine's address; None when it is free."""
        host, port = engine_address(self.launch)
        holder = port_holder(host, port)
        if holder is None:
            return None
        taken = port_taken(port, holder, next_free_port(host, port))
        return self._noted(
            ServerEvent("gave-up", taken.sentence, cause=taken, restarts=self.restarts)
        )

    async def _spawn(self, argv: list[str]) -> asyncio.subprocess.Process | ServerEvent:
        """The engine's process, in its own session, dying with lucebox; the give-up when the
        binary is gone or cannot run (no retry helps)."""
        try:
            return await asyncio.create_subprocess_exec(
                *argv,
                env=engine_environ(self.launch, os.environ),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        except OSError as exc:
            build_command = kinds.kind(self.launch.kind).build_command
            missing = engine_missing(argv[0], exc.strerror or str(exc), build_command)
            return self._noted(
                ServerEvent("gave-up", missing.sentence, cause=missing, restarts=self.restarts)
            )

    async def _serve(
        self, process: asyncio.subprocess.Process
    ) -> Literal["restart", "sleep"] | None:
        """While the ready engine serves: until a stop, a restart, a sleep, a hang or its exit.
        A hung engine is killed here; returns the restart or sleep asked (and no stop)."""
        waits = {
            asyncio.create_task(event.wait())
            for event in (self._stopping, self._restart_asked, self._hang_seen, self._sleep_asked)
        }
        exit_wait = asyncio.create_task(process.wait())
        await asyncio.wait({*waits, exit_wait}, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
        if self._hang_seen.is_set() and not self._stopping.is_set():
            # A stopped engine ignores SIGTERM, and a hung one has no slot to save.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
        if self._restart_asked.is_set() and not self._stopping.is_set():
            self._restart_asked.clear()
            return "restart"
        alive = process.returncode is None  # one that died (or hung) is restarted as such
        if self._sleep_asked.is_set() and not self._stopping.is_set() and alive:
            self._sleep_asked.clear()
            return "sleep"
        return None

    async def _asleep(self) -> AsyncIterator[ServerEvent]:
        """The engine stopped on purpose to free its memory: no crash, no restart counted; the
        same launch starts again once woken (:meth:`wake`), the asked one on a restart, unless
        a stop comes first."""
        self.process = None
        message = "engine asleep (its memory freed); the next request starts it"
        yield self._noted(ServerEvent("sleeping", message, restarts=self.restarts))
        waits = {
            asyncio.create_task(event.wait())
            for event in (self._stopping, self._wake_asked, self._restart_asked)
        }
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()
        self._wake_asked.clear()
        if self._stopping.is_set():
            yield ServerEvent("stopped", "engine stopped", restarts=self.restarts)
        elif self._restart_asked.is_set():
            self._restart_asked.clear()
            asked, self._restart_spec = self._restart_spec, None
            yield self._relaunch(
                asked or self.launch, "restarting as asked", None, None, planned=True
            )
        else:
            self.log.write("# lucebox: waking: a request came")
            self._woken = True

    async def _after_death(self, death: EngineDeath, pid: int) -> AsyncIterator[ServerEvent]:
        """What follows an engine's death: back to the planned launch after a trial, a
        rebuild for a lower CPU baseline, a restart after a backoff, or giving up."""
        exited = ServerEvent(
            "exited",
            f"engine exited ({death.returncode}): {death.sentence}",
            pid,
            death,
            self.restarts,
        )
        if self.fallback is not None:
            back, self.fallback = self.fallback, None
            yield self._noted(exited)
            message = "back to the planned launch: the one tried died"
            yield self._relaunch(back, message, pid, death, planned=True)
            return
        self._count_crash()
        yield self._noted(exited)
        rebuild_to = self._rebuild_target() if death.code == "illegal-instruction" else None
        if rebuild_to is not None:
            yield self._noted(
                ServerEvent(
                    "restarting",
                    f"rebuilding the same engine version for {rebuild_to}, once: the "
                    f"{self.cpu_target} build died of an illegal instruction (a few minutes)",
                    pid,
                    death,
                    self.restarts,
                )
            )
            rebuilt = await self._rebuild(rebuild_to)
            if isinstance(rebuilt, ServerLaunch):
                self._rebuilt_from, self.cpu_target = self.cpu_target, rebuild_to
                yield self._relaunch(rebuilt, f"rebuilt for {rebuild_to}: starting it", pid, death)
                return
            if self._stopping.is_set():
                yield ServerEvent("stopped", "engine stopped", pid, restarts=self.restarts)
                return
            step = f"the rebuild for {rebuild_to} failed ({rebuilt}): {REPORT_STEP}"
            death = dataclasses.replace(death, next_step=step)
        async for event in self._restart_or_give_up(death, pid):
            yield event

    async def _restart_or_give_up(self, death: EngineDeath, pid: int) -> AsyncIterator[ServerEvent]:
        """The same launch again after a backoff (a smaller context after running out of
        memory), or the give-up once crashes loop or no retry helps."""
        next_spec = self._after_crash(death)
        if next_spec is None:
            done = self.after_give_up(death) if self.after_give_up else None
            crashes = _crashes(len(self._crash_times))
            message = f"gave up after {crashes} in {self.policy.window_s:.0f} s: "
            message += f"{death.code}: {death.sentence}" + (f"; {done}" if done else "")
            yield self._noted(ServerEvent("gave-up", message, pid, death, self.restarts))
            return
        backoff = min(
            self.policy.max_backoff_s,
            self.policy.first_backoff_s * 2 ** (len(self._crash_times) - 1),
        )
        if next_spec is not self.launch:
            message = (
                f"out of memory: retrying once at a smaller context ({next_spec.plan.ctx} tokens)"
            )
        else:
            message = f"restarting in {backoff:.0f} s"
        yield self._relaunch(next_spec, message, pid, death)
        await event_within(self._stopping, backoff)

    def _relaunch(
        self,
        server: ServerLaunch,
        message: str,
        pid: int | None,
        cause: EngineDeath | None,
        *,
        planned: bool = False,
    ) -> ServerEvent:
        """Every restart, asked for or after a crash: the next engine runs ``server``. Only
        the engine's own deaths count in ``restarts``; lucebox's own restarts (a calibration's
        trial, the speculation guard, going back from a mode tried) in ``planned_restarts``."""
        self.launch = server
        if planned:
            self.planned_restarts += 1
        else:
            self.restarts += 1
        return self._noted(
            ServerEvent("restarting", message, pid, cause, self.restarts, planned=planned)
        )

    def _noted(self, event: ServerEvent) -> ServerEvent:
        """The event, also written to the engine log: whoever reads it there learns why the
        engine died and what lucebox did about it."""
        self.log.write(f"# lucebox: {event.kind}: {event.message}")
        return event

    def _count_crash(self) -> None:
        now = time.monotonic()
        self._crash_times = [t for t in self._crash_times if now - t < self.policy.window_s]
        self._crash_times.append(now)

    def _after_crash(self, death: EngineDeath) -> ServerLaunch | None:
        if not death.retry:
            return None  # the same command fails the same way: do not hammer it
        if death.code == "gpu-out-of-memory" and self.replan_on_oom is not None:
            if self._oom_retried:
                return None  # the re-planned launch ran out of memory too: do not hammer it
            self._oom_retried = True
            return self.replan_on_oom(self.launch)
        if len(self._crash_times) >= self.policy.max_crashes:
            return None
        return self.launch

    def _rebuild_target(self) -> str | None:
        """The baseline the engine is rebuilt for after an illegal instruction: the next one
        down, once; None when it is not rebuilt."""
        if self.rebuild_for_cpu is None or self._rebuilt_from is not None:
            return None
        below = cputarget.below(self.cpu_target)
        return below.name if below is not None else None

    async def _rebuild(self, target: str) -> ServerLaunch | str:
        """The launch on the engine rebuilt for ``target``, or why there is none (the build
        failed, or a stop cancelled it)."""
        assert self.rebuild_for_cpu is not None
        cancel = threading.Event()
        building = asyncio.create_task(
            asyncio.to_thread(self.rebuild_for_cpu, self.launch, target, cancel)
        )
        stopping = asyncio.create_task(self._stopping.wait())
        await asyncio.wait({building, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not building.done():
            cancel.set()  # the build stops at its next line of output
        try:
            return await building
        except LuceboxError as exc:
            self.log.write(f"# lucebox: the rebuild for {target} failed: {exc.message}")
            return exc.message

    def _stamp_files(self) -> tuple[FileStamp, ...]:
        paths = (self.launch.model_path, self.launch.draft_path)
        return tuple(stamp for path in paths if path and (stamp := file_stamp(path)))

    def _name_death(
        self,
        returncode: int,
        lines_before: int,
        launched: tuple[FileStamp, ...],
        stopped_why: str | None,
        hung_why: str | None,
    ) -> EngineDeath:
        """The engine's death named from what is known now (the facts are read here)."""
        own_lines = min(self.lines_total - lines_before, len(self.ring), DEATH_LINES)
        lines = list(self.ring)[-own_lines:] if own_lines > 0 else []
        killed = returncode == -signal.SIGKILL and stopped_why is None and hung_why is None
        now = {stamp.path: file_stamp(stamp.path) for stamp in launched}
        facts = DeathFacts(
            stopped_why=stopped_why,
            cpu_target=self.cpu_target,
            rebuild_target=self._rebuild_target() if returncode == -signal.SIGILL else None,
            rebuilt_from=self._rebuilt_from,
            build_command=kinds.kind(self.launch.kind).build_command,
            changes=tuple(
                change
                for stamp in launched
                if (change := changed_file(stamp, now[stamp.path])) is not None
            ),
            model_name=self.model_name,
            host_ram_terms=host_ram_terms(self.launch.plan.memory_bytes) if killed else None,
            ram_available_bytes=psutil.virtual_memory().available if killed else None,
            ram_users=ram_users() if killed else (),
            oom_kills_since_start=oom_kills_since(self._oom_kills_at_start) if killed else None,
            down_peers=down_peers(self.launch.rpc),
            hung_why=hung_why,
        )
        return name_death(returncode, lines, facts)

    async def _terminate(self, process: asyncio.subprocess.Process) -> None:
        """SIGTERM the engine's process group, wait, then SIGKILL."""
        if process.returncode is not None:
            return
        if self.before_stop is not None:
            await self.before_stop()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            async with asyncio.timeout(prefixdisk.stop_timeout_s(self.launch, STOP_TIMEOUT_S)):
                await process.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()

    @property
    def stop_requested(self) -> bool:
        return self._stopping.is_set()

    def stop(self) -> None:
        """Stop the engine and end :meth:`events`; serverrun.ServerRun.stop is the caller."""
        self._stopping.set()

    def hung(self, why: str) -> None:
        """Kill the serving engine, which made no progress (``why``), and restart it through
        the crash path; serverrun.ServerRun's hang watch is the caller."""
        self._hung_why = why
        self._hang_seen.set()

    def sleep(self) -> None:
        """Stop the serving engine (its slot saved first) and start the same launch again only
        once :meth:`wake` is called; sleepwatch.SleepWatch is the caller, through the run."""
        self._wake_asked.clear()
        self._sleep_asked.set()

    def wake(self) -> None:
        """Start the sleeping engine again (at once, should it still be stopping)."""
        self._wake_asked.set()

    def restart(self, server: ServerLaunch | None = None) -> None:
        """Stop the serving engine and start it again, with ``server`` when given (no crash
        counted, no backoff); serverrun.ServerRun.restart is the caller."""
        self._restart_spec = server
        self._restart_asked.set()
