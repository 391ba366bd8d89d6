"""Supervise llama-server: start it, know when it is ready, bring it back, say why it died.

The engine runs in its own process group with a parent-death signal, so it cannot outlive
lucebox; its output goes to a rotating log file and an in-memory ring for the UI. Events are
an async iterator that the CLI and the TUI both consume.

``events`` is one state machine (start, loading, ready, exit, backoff, give up): one engine's
life is ``_one_engine``, what follows its death ``_after_death``. Its parts (the process, the
log, readiness, the restart policy, the CPU rebuild, naming a death) are in ``supervision/``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Literal

from lucebox.engine.core.errors import RunError
from lucebox.engine.core.waits import event_within
from lucebox.engine.plan.launch import ServerLaunch, server_argv, url_of
from lucebox.engine.run import prefixdisk
from lucebox.engine.run.death import REPORT_STEP, EngineDeath
from lucebox.engine.run.kinds.enginerun import engine_run
from lucebox.engine.run.kinds.ownrequests import OwnRequests
from lucebox.engine.run.supervision.cpurebuild import CpuRebuild, baseline_below, rebuild
from lucebox.engine.run.supervision.enginedeath import (
    EngineBuild,
    EngineStart,
    engine_start,
    name_engine_death,
)
from lucebox.engine.run.supervision.enginelog import RotatingLog
from lucebox.engine.run.supervision.engineprocess import address_taken, kill, spawn, terminate
from lucebox.engine.run.supervision.readiness import wait_ready
from lucebox.engine.run.supervision.restartpolicy import CrashHistory, RestartPolicy
from lucebox.engine.run.supervision.serverevent import FINAL, ServerEvent

# ServerEvent is imported from here by the run's readers: they take it with what yields it.

RING_LINES = 2000


class PortInUseError(RunError):
    """The port is held by another program."""


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
        self._crashes = CrashHistory()
        self.cpu_target: str | None = None
        """The CPU baseline of the engine build that runs; None for one lucebox did not build."""
        self.rebuild_for_cpu: CpuRebuild | None = None
        """Builds the served engine's version again for a lower CPU baseline; None: an engine
        that dies of an illegal instruction is not rebuilt."""
        self._rebuilt_from: str | None = None
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

    async def events(self) -> AsyncIterator[ServerEvent]:
        """Start the engine and keep it up until ``stop`` or a crash loop; yield what happens."""
        try:
            while not self._stopping.is_set():
                last: ServerEvent | None = None
                async for last in self._one_engine():
                    yield last
                if last is None or last.kind in FINAL:
                    return
        finally:
            if self.process is not None and self.process.returncode is None:
                await terminate(self.process, self.launch, self.before_stop)
            self.log.close()

    async def _one_engine(self) -> AsyncIterator[ServerEvent]:
        """One engine process from its start to its end, then what follows it: a restart
        (the last event says ``restarting``), or the end of the run (``gave-up``, ``stopped``)."""
        taken = address_taken(self.launch)
        if taken is not None:
            yield self._gave_up(taken)
            return
        argv = server_argv(self.launch)
        woken, self._woken = self._woken, False
        if woken:  # the same launch passed its warm-up before it slept
            argv += engine_run(self.launch.kind).wake_argv
        for dropped in prefixdisk.before_start(self.launch):
            self.log.write(f"# lucebox: saved prompt states over budget: removed {dropped}")
        self.log.write(f"# lucebox: starting {' '.join(argv)}")
        start = engine_start(self.launch, self.lines_total)
        process = await spawn(self.launch, argv)
        if isinstance(process, EngineDeath):
            yield self._gave_up(process)
            return
        self.process = process
        assert process.stdout is not None
        pump = asyncio.create_task(self._pump(process.pid, process.stdout))
        ctx = self.launch.plan.ctx
        started = f"engine started (pid {process.pid}, ctx {ctx})"
        yield ServerEvent("starting", started, process.pid, restarts=self.restarts, ctx=ctx)
        yield ServerEvent("loading", "loading the model", process.pid, restarts=self.restarts)
        unready = await wait_ready(
            self.launch,
            process,
            ready_timeout_s=self.ready_timeout_s,
            stopping=self._stopping,
            own_requests=self.own_requests,
            log=self.log,
            woken=woken,
        )
        if unready is None:
            serving = f"serving at {url_of(self.launch)}"
            yield ServerEvent("ready", serving, process.pid, restarts=self.restarts)
            wanted = await self._serve(process)
            if wanted is not None:
                await terminate(process, self.launch, self.before_stop)
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
            await terminate(process, self.launch, self.before_stop)
            await pump
            yield ServerEvent("stopped", "engine stopped", process.pid, restarts=self.restarts)
            return
        if process.returncode is None:  # never became ready in time
            await terminate(process, self.launch, self.before_stop)
        else:
            unready = None
        await pump
        assert process.returncode is not None
        death = self._name_death(process.returncode, start, unready)
        async for event in self._after_death(death, process.pid):
            yield event

    def _name_death(
        self, returncode: int, start: EngineStart, stopped_why: str | None
    ) -> EngineDeath:
        """The ended engine's death, named with what this run knows of it (a hang it saw)."""
        hung_why, self._hung_why = self._hung_why, None
        self._hang_seen.clear()
        build = EngineBuild(
            self.cpu_target, self._rebuild_target(), self._rebuilt_from, self.model_name
        )
        return name_engine_death(
            returncode,
            self.ring,
            self.lines_total,
            start,
            self.launch,
            build,
            stopped_why=stopped_why,
            hung_why=hung_why,
        )

    def _gave_up(self, death: EngineDeath) -> ServerEvent:
        """The give-up when the engine cannot start (its address taken, its binary gone)."""
        return self._noted(
            ServerEvent("gave-up", death.sentence, cause=death, restarts=self.restarts)
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
            await kill(process)
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
        said = f"engine exited ({death.returncode}): {death.sentence}"
        exited = ServerEvent("exited", said, pid, death, self.restarts)
        if self.fallback is not None:
            back, self.fallback = self.fallback, None
            yield self._noted(exited)
            message = "back to the planned launch: the one tried died"
            yield self._relaunch(back, message, pid, death, planned=True)
            return
        self._crashes.count(self.policy)
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
            assert self.rebuild_for_cpu is not None
            rebuilt = await rebuild(
                self.rebuild_for_cpu, self.launch, rebuild_to, self._stopping, self.log
            )
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
        next_spec = self._crashes.next_launch(death, self.launch, self.policy, self.replan_on_oom)
        if next_spec is None:
            done = self.after_give_up(death) if self.after_give_up else None
            message = self._crashes.gave_up(self.policy, death) + (f"; {done}" if done else "")
            yield self._noted(ServerEvent("gave-up", message, pid, death, self.restarts))
            return
        backoff, message = self._crashes.backoff(next_spec, self.launch, self.policy)
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

    def _rebuild_target(self) -> str | None:
        """The baseline the engine is rebuilt for after an illegal instruction: the next one
        down, once; None when it is not rebuilt."""
        if self.rebuild_for_cpu is None or self._rebuilt_from is not None:
            return None
        return baseline_below(self.cpu_target)

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
