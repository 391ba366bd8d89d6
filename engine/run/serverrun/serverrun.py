"""The running server, with the one way to stop or restart it: supervises the engine, samples
it once ready, saves and restores its slot, applies the speculation guard's decisions
(:mod:`specwatch`) and keeps the state file (:mod:`runstate`) current."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Literal

from lucebox.engine.core.errors import LuceboxError
from lucebox.engine.core.paths import Paths
from lucebox.engine.machine.gpu import NvmlProvider
from lucebox.engine.plan.launch import ServerLaunch, engine_url, server_argv, url_of
from lucebox.engine.plan.prefillrates import PrefillRecorder
from lucebox.engine.plan.speculation.specguard import SpecGuard
from lucebox.engine.plan.speculation.workload import ServedRequest
from lucebox.engine.run import prefixdisk, specwatch
from lucebox.engine.run.death import EngineDeath
from lucebox.engine.run.front.front import Front
from lucebox.engine.run.front.frontsetup import FrontSetup
from lucebox.engine.run.gpustatus import gpu_statuses, nvml_session
from lucebox.engine.run.kinds.metrics import Sampler, with_last_rates
from lucebox.engine.run.lastserved import write_last_served
from lucebox.engine.run.runsetup import Calibrations, RunFacts, SpecSetup
from lucebox.engine.run.runstate import Status, state_file, write_status
from lucebox.engine.run.sample import EngineStatus, Sample
from lucebox.engine.run.servedsetmodels import ModelNote, ModelsSample
from lucebox.engine.run.serverrun.serverfront import ServedFront, front_setup, open_front
from lucebox.engine.run.serverrun.serversampling import (
    cpu_prefill,
    engine_sampler,
    hang_watched,
    log_reader,
    with_client_waits,
)
from lucebox.engine.run.serverrun.serverspec import spec_view, watch_step
from lucebox.engine.run.serverrun.serverstatus import (
    RunState,
    engine_status,
    first_status,
    served_record,
    status_after,
    status_now,
)
from lucebox.engine.run.sideserver import SideServers
from lucebox.engine.run.sleepwatch import SleepWatch, sleep_watch
from lucebox.engine.run.slotkeeper import SlotKeeper
from lucebox.engine.run.supervision.serverevent import ServerEvent
from lucebox.engine.run.supervisor import Supervisor

RunItem = ServerEvent | Sample | ModelsSample | ModelNote
"""What a run yields: the supervisor's events, one model's samples, or a set's models and
what the run did to one of them."""


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
        facts: RunFacts,
        speculation: SpecSetup | None = None,
        calibrations: Calibrations | None = None,
    ) -> None:
        speculation = speculation or SpecSetup()
        self.paths = paths
        self.supervisor = supervisor
        self.facts = facts
        self.calibrations = calibrations or Calibrations()
        self.spec_watch = specwatch.SpecWatch(speculation.guard, speculation.asked)
        """The speculation guard and what it decided."""
        self.on_spec_decision = speculation.on_decision
        self.spec_reason = speculation.reason
        """Why the serving speculation runs: the plan's reason, then the calibration's or the
        guard's."""
        self.url = engine_url(supervisor.launch)
        """The engine itself (its private port behind the front): samples, slots, probes."""
        self.public_url = url_of(supervisor.launch)
        """What clients use: the front's address."""
        self.front: Front | None = None
        """lucebox's front while the run serves; None for an engine that serves its address
        itself (a served set's router)."""
        self._run = RunState(
            first_status(paths, supervisor.launch, facts, self.public_url, speculation.reason)
        )
        self._sampling: asyncio.Task[None] | None = None
        self._slots = SlotKeeper(paths, supervisor, self.url)
        self._sampler: Sampler | None = None
        """The live engine's sampler: a new speculation reason reaches it without a restart."""
        self._engine_ready = False
        """Whether the engine said ready and has not stopped since (its slot can be saved)."""
        self._clients_held = False
        """Client requests wait in the front (the engine runs what they must not be served by)."""
        self._sleep: SleepWatch | None = sleep_watch(self, facts.sleep_idle_s)
        self._sides = SideServers(facts.sides, paths.logs_dir)
        """The embedding and reranker models' processes beside the engine."""
        supervisor.on_line = self._feed_line
        supervisor.before_stop = self._engine_stopping

    @property
    def api_key(self) -> str | None:
        """The key the engine was started with, for the run's own requests (samples, slot
        saves, the calibrations' probes)."""
        return self.facts.api_key

    @property
    def status(self) -> Status:
        return self._run.status

    def stop(self) -> None:
        """Stop the engine and end the run (quit, `lucebox down`, SIGINT/SIGTERM)."""
        self.supervisor.stop()

    def restart(self, server: ServerLaunch | None = None) -> None:
        """Stop the serving engine and start it again, with ``server`` when given; the status
        says so at once, so no sample of the engine on its way out reads as what now serves."""
        self.supervisor.restart(server)
        if self._sleep is not None:
            self._sleep.restarted()
        self._run.status = replace(self._run.status, state="restarting")
        if self.front is not None:
            self.front.engine_ready(False)

    def hold_clients(self, held: bool) -> None:
        """Keep clients' requests waiting in the front while the engine runs a configuration
        they must not be served by (a long-context mode being measured that is not the one
        planned: it may not be exact); they go in once the planned launch serves again."""
        self._clients_held = held
        if self.front is not None:
            # Released while a restart is under way, the front opens at the next ready.
            ready = self._engine_ready and self._run.status.state == "ready"
            self.front.engine_ready(ready and not held)

    def serve_measured(self, server: ServerLaunch, reason: str, guard: SpecGuard | None) -> None:
        """Serve what the calibration chose, watched by ``guard``; one restart when it differs
        from what runs now."""
        self.spec_watch = self.spec_watch.serving(guard)
        self.spec_reason = reason
        if server_argv(server) != server_argv(self.supervisor.launch):
            self.restart(server)
        elif self._sampler is not None:
            self._sampler.spec_reason = reason

    def _watch_speculation(
        self, sample: Sample, requests: Sequence[ServedRequest], engine_pid: int
    ) -> None:
        """Feed the guard and the calibration's watch of the served mix with the requests
        that finished since the last sample (of engine ``engine_pid``); apply the guard's
        decision once no request is running (one restart)."""
        current = self.supervisor.launch
        decide = self.on_spec_decision
        self.spec_watch, decision = watch_step(
            self.spec_watch,
            self.calibrations,
            self.front,
            current,
            sample,
            requests,
            engine_pid,
            applies=decide is not None,
        )
        if decision is None or decide is None:
            return
        self.spec_reason = decision.reason
        changed = decide(decision, current)
        if changed is not None:
            self.restart(changed)

    def _feed_line(self, engine_pid: int, line: str) -> None:
        facts = self._run.logs.get(engine_pid)
        if facts is None:
            # Only the current engine's lines matter: forget an earlier engine's.
            self._run.logs = {engine_pid: (facts := log_reader(self.supervisor))}
        facts.feed(line)

    async def _engine_stopping(self) -> None:
        """Runs before the supervisor stops a live engine on purpose: sampling ends first,
        then the slot is saved so the next start answers from a warm cache."""
        await self._stop_sampling()
        if self._engine_ready:  # the status may already say restarting: a restart was asked
            await self._slot("save")

    async def keep_conversation(self) -> None:
        """Before lucebox's own request takes the engine's slot: a client's conversation in it
        that no file holds yet is saved first, so the launch served next restores it."""
        if self._engine_ready:
            await self._slot("save", stopping=False)

    async def _slot(self, action: Literal["save", "restore"], *, stopping: bool = True) -> None:
        saved = await self._slots.act(
            action, self.front, self.api_key, stopping=stopping, now_s=time.monotonic()
        )
        if saved:
            cache = self._slots.with_save_failure(self._run.status.cache)
            self._run.status = replace(self._run.status, cache=cache)

    async def _stop_sampling(self) -> None:
        task, self._sampling = self._sampling, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def engine_status(self) -> EngineStatus | None:
        """The engine kind serving now and what chose it (:func:`serverstatus.engine_status`)."""
        kind = self.supervisor.launch.kind
        return engine_status(self.facts.planned_engine, kind, self.calibrations.engine)

    def _save(self) -> None:
        self._run.status = status_now(
            self._run.status,
            engine=self.engine_status(),
            sides=self._sides,
            front=self.front,
            sleep=self._sleep,
            kv_modes=self.calibrations.kv_modes,
            kind=self.supervisor.launch.kind,
        )
        write_status(self.paths, self._run.status)

    async def events(self) -> AsyncIterator[RunItem]:
        """Supervise the engine and sample it once ready; yields both streams as they come.

        Keeps the state file that `lucebox status` reads, and removes it when the run ends.
        """

        queue: asyncio.Queue[RunItem | None] = asyncio.Queue()
        listening = await self._open_front()
        if isinstance(listening, EngineDeath):  # the served address is taken: nothing starts
            self.supervisor.log.write(f"# lucebox: gave-up: {listening.sentence}")
            gave_up = ServerEvent("gave-up", listening.sentence, cause=listening)
            self._run.status = replace(self._run.status, state="failed", cause=listening)
            yield gave_up
            return

        async def follow_supervisor() -> None:
            try:
                async for event in self.supervisor.events():
                    await queue.put(event)
            finally:
                await queue.put(None)

        supervising = asyncio.create_task(follow_supervisor())
        sides = self._sides
        siding = asyncio.create_task(sides.run())
        calibrating = [asyncio.create_task(c.run(self)) for c in self.calibrations.present()]
        if self._sleep is not None and self.front is not None:
            self.front.on_request = self._sleep.saw_request
            calibrating.append(asyncio.create_task(self._sleep.run()))
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, ServerEvent):
                    await self._on_event(item, queue)
                self._save()
                yield item
        finally:
            try:
                for task in calibrating:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                self.supervisor.stop()
                sides.stop()
                await self._stop_sampling()
                await siding
                with contextlib.suppress(asyncio.CancelledError):
                    await supervising  # a refused re-plan raises here
            finally:
                if listening is not None:
                    listening.close()
                    self.front = None
                state_file(self.paths).unlink(missing_ok=True)

    def _front_spec(self) -> FrontSetup:
        launch = self.supervisor.launch
        return front_setup(launch, self.facts, self.paths, self.supervisor.ready_timeout_s)

    async def _open_front(self) -> ServedFront | EngineDeath | None:
        """lucebox's front on the served address (:mod:`serverfront`); None when the engine
        serves the address itself."""
        if self.supervisor.launch.engine_port is None:
            return None
        opened = await open_front(
            self._front_spec(), self.facts, self.paths, self.supervisor, lambda: self._run.status
        )
        if isinstance(opened, ServedFront):
            self.front = opened.front
            if opened.lan is not None:
                self._run.status = replace(self._run.status, lan=opened.lan)
        return opened

    async def _on_event(self, event: ServerEvent, queue: asyncio.Queue[RunItem | None]) -> None:
        supervisor = self.supervisor
        self._run.status = status_after(
            self._run.status, event, supervisor.planned_restarts, supervisor.launch.plan.ctx
        )
        self._engine_ready = event.kind == "ready" and event.pid is not None
        if self.front is not None and not self._engine_ready:
            self.front.engine_ready(False)
        # An engine that is not ready (or no longer) is not sampled.
        await self._stop_sampling()
        if event.kind == "ready" and event.pid is not None:
            if self.front is not None:  # a re-plan may have changed the context
                self.front.spec = self._front_spec()
            self._record_served()
            await self._slot("restore")
            if self.front is not None and self._still_serving(event.pid):
                # Clients that waited go in after the restore.
                self.front.engine_ready(not self._clients_held)
            self._sampling = asyncio.create_task(self._sample(event.pid, queue))

    def _still_serving(self, engine_pid: int) -> bool:
        """Whether the engine that said ready still serves once its slot is restored: no
        restart or stop was asked meanwhile, and no other process took its place."""
        return (
            self._run.status.state == "ready"
            and self.supervisor.pid == engine_pid
            and not self.supervisor.stop_requested
        )

    @property
    def served_aliases(self) -> tuple[str, ...]:
        """The model names clients may ask for."""
        return (self.supervisor.launch.alias,)

    def _record_served(self) -> None:
        """Keep the address and alias for `lucebox connect` once the run has ended."""
        launch = self.supervisor.launch
        record = served_record(self.public_url, self.served_aliases, launch, self.facts.sides)
        with contextlib.suppress(OSError, LuceboxError):
            write_last_served(self.paths, record)

    async def _sample(self, engine_pid: int, queue: asyncio.Queue[RunItem | None]) -> None:
        with nvml_session() as nvml:
            await self._sample_with(engine_pid, queue, nvml)

    async def _sample_with(
        self, engine_pid: int, queue: asyncio.Queue[RunItem | None], nvml: NvmlProvider | None
    ) -> None:
        spec = self.supervisor.launch
        facts = self._run.logs.get(engine_pid)
        if facts is None:  # made only when missing: a new log resets the own-request ledger
            facts = self._run.logs[engine_pid] = log_reader(self.supervisor)
        prefill = cpu_prefill(self.paths, spec)
        sampler = engine_sampler(
            spec,
            self.url,
            engine_pid,
            facts,
            nvml=nvml,
            gpu_index=self.facts.gpu_index,
            api_key=self.api_key,
            spec_reason=self.spec_reason,
        )
        self._sampler = sampler
        bounds = self.facts.hang_bounds
        async with hang_watched(sampler, bounds, self.supervisor, lambda: self.front, self._run):
            await self._follow(sampler, engine_pid, queue, nvml, prefill)

    async def _follow(
        self,
        sampler: Sampler,
        engine_pid: int,
        queue: asyncio.Queue[RunItem | None],
        nvml: NvmlProvider | None,
        prefill: PrefillRecorder | None,
    ) -> None:
        async for engine_sample in sampler.samples():
            sample = with_client_waits(engine_sample, self.front)
            await queue.put(sample)
            # Status shows the last known rate, not an idle second's missing one.
            self._run.sample = with_last_rates(self._run.sample, sample)
            self._run.status = replace(
                self._run.status,
                gpus=gpu_statuses(nvml) if nvml is not None else (),
                sample=self._run.sample,
                spec=spec_view(
                    self.spec_watch,
                    self.calibrations,
                    self.supervisor.launch,
                    self.front,
                    sampler.spec_status(),
                ),
                cache=prefixdisk.with_disk(
                    self._slots.cache_status(sampler.cache_status()),
                    self.supervisor.launch,
                ),
            )
            self._watch_speculation(sample, [r.served() for r in sampler.finished], engine_pid)
            if prefill is not None:
                prefill.observe(sample.prefill_tokens_total, sample.prefill_seconds_total)
