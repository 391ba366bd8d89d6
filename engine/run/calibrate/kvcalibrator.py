"""The long-context modes measured while a Lucebox launch with a long context runs: once idle,
each mode the planner can serve at the served context (the exact cache at each KV type, a
KVFlash pool at each), a restart through the planner each, over the probe set plus one long
probe; stored as it goes (plan/lucebox/kvmodes.py), then the planned launch serves again.

The probes send the sampling the front's requests got, and each sampling's modes are kept
apart (as the speculation and engine calibrations' rates are): once the served sampling moves,
the modes at the new one are measured once idle where the store lacks them.

It only measures: what serves is the plan's (exact while an exact cache gives the context,
else KVFlash; or what the user pinned), so a lossy mode never comes on because it measured
faster, and no client is ever served by a mode being measured: while one runs, client requests
wait in the front; one that comes abandons the measurement at once, the planned launch starts
again and serves it, and the measurement resumes from the next mode once idle.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx

from lucebox.engine.core.errors import LuceboxError
from lucebox.engine.core.paths import Paths
from lucebox.engine.plan.launch import server_argv
from lucebox.engine.plan.lucebox import kvmodes
from lucebox.engine.plan.lucebox.kvmodes import KvModes, KvModesPlan, KvTrial, ModeRate
from lucebox.engine.plan.lucebox.kvmodeview import ModesStatus
from lucebox.engine.run.calibrate.probes import PROBES, long_probe
from lucebox.engine.run.calibrate.probing import (
    WARM_UP,
    MeasuredRun,
    ProbePace,
    ProbeSender,
    ask,
    restart_into,
)

if TYPE_CHECKING:
    from lucebox.engine.plan.launch import ServerLaunch
    from lucebox.engine.plan.speculation.workload import ServedRequest

LONG_REPLY_TOKENS = 128
"""The long probe's reply: enough decode steps for a rate after the long prompt."""


@dataclass(frozen=True)
class KvSetup:
    """What one launch's long-context modes are and how each is planned (the one planner)."""

    modes: KvModesPlan
    pace: ProbePace
    """When it may probe: the speculation and engine calibrations go first."""
    plan_trial: Callable[[KvTrial], ServerLaunch | str]
    """The launch serving that mode at the served context, or why it cannot serve here."""
    plan_final: Callable[[], ServerLaunch | None]
    """The launch the plan serves, once the modes are measured."""


class KvModeCalibrator(ProbeSender[KvTrial]):
    """One launch's long-context mode measurement; ``run`` drives it inside a MeasuredRun."""

    def __init__(self, paths: Paths, setup: KvSetup) -> None:
        super().__init__(setup.pace)
        self.paths = paths
        self.setup = setup
        self.measurement = kvmodes.read_modes(paths, setup.modes.key) or KvModes(setup.modes.key)
        self.state = "done" if self.complete else "waiting"
        self.trial: KvTrial | None = None
        """The mode being measured now."""
        self._long = long_probe(kvmodes.LONG_PROBE, setup.modes.long_tokens, LONG_REPLY_TOKENS)

    @property
    def complete(self) -> bool:
        return all(self.measurement.done(t.label) for t in self.setup.modes.trials)

    def status(self) -> ModesStatus:
        """The modes measured so far, as status shows them."""
        trials = self.setup.modes.trials
        return ModesStatus(
            self.state,
            self.trial.label if self.trial is not None else None,
            kvmodes.views(self.measurement, self.setup.modes.serving),
            tuple(t.label for t in trials if not self.measurement.done(t.label)),
        )

    what = "long-context mode measurement"
    client_timeout_s = 900.0
    """The long probe's prompt takes longer than the others."""

    def _forced(self) -> bool:
        """Measured once per sampling: what serves is the plan's, whatever the modes
        measure."""
        return False

    def _follow_sampling(self, server: MeasuredRun) -> None:
        """Probe at the sampling the front's requests got; its modes are stored apart."""
        at = self._served_sampling(server)
        self._at_sampling(at)

    def _at_sampling(self, at: str | None) -> None:
        """The modes measured at ``at`` (None: those held now)."""
        key = kvmodes.at_sampling(self.measurement.key, at) if at is not None else None
        if key is not None and key != self.measurement.key:
            self.measurement = kvmodes.read_modes(self.paths, key) or KvModes(key)

    def observe(self, requests: Sequence[ServedRequest]) -> None:
        """Requests the clients were served: once their sampling moved from the one the modes
        were measured at, those at the new one are read, and measured once idle where the
        store lacks them."""
        if self.state != "done" or not requests:
            return
        self._at_sampling(self._sampling_now())
        if not self.complete:
            self.state = "waiting"
            self._due.set()

    async def _calibrate(self, server: MeasuredRun) -> None:
        try:
            await self._measure_all(server)
        finally:
            # Whatever stopped it, the planned launch serves and clients go in.
            try:
                self._serve_planned(server)
            except LuceboxError as exc:
                server.supervisor.log.write(f"# lucebox: back to the planned launch: {exc}")
            self.state, self.trial = "done", None

    def _todo(self, server: MeasuredRun) -> Sequence[KvTrial]:
        self._follow_sampling(server)
        todo = [t for t in self.setup.modes.trials if not self.measurement.done(t.label)]
        running = kvmodes.served_label(*_kv_of(server.supervisor.launch))
        return sorted(todo, key=lambda t: t.label != running)

    async def _measure_one(
        self, client: httpx.AsyncClient, server: MeasuredRun, trial: KvTrial
    ) -> bool:
        self.trial = trial
        rate = await self._measure(client, server, trial)
        if isinstance(rate, str):
            self._keep(self.measurement.with_refused(trial.label, rate))
        elif rate is not None:
            self._keep(self.measurement.with_rate(rate))
        else:  # a client came: the planned launch serves it
            self._serve_planned(server)
            return False
        return True

    def _serve_planned(self, server: MeasuredRun) -> None:
        """The launch the plan serves, again (a restart when a trial's mode runs); clients go
        in once it is ready."""
        server.supervisor.fallback = None
        final = self.setup.plan_final()
        if final is not None and server_argv(final) != server_argv(server.supervisor.launch):
            server.restart(final)
        server.hold_clients(False)

    def _keep(self, measurement: KvModes) -> None:
        self.measurement = measurement
        kvmodes.write_modes(self.paths, measurement)

    async def _measure(
        self, client: httpx.AsyncClient, server: MeasuredRun, trial: KvTrial
    ) -> ModeRate | str | None:
        """``trial``'s probes, or why it cannot serve here; None when a client came."""
        launch = server.supervisor.launch
        if kvmodes.served_label(*_kv_of(launch)) != trial.label:
            planned = self.setup.plan_trial(trial)
            if isinstance(planned, str):
                return planned
            if await self._client_seen(client, server, probing=False):
                return None  # a client waits: no restart into a mode it would wait through
            server.hold_clients(True)  # no client is served by a mode it did not choose
            # Should the mode die, the supervisor goes back to this launch at once.
            server.supervisor.fallback = self.setup.plan_final() or launch
            if not await restart_into(server, planned) or not _runs(server, planned):
                self._serve_planned(server)
                return f"the engine did not run with it here: {_cause(server)}"
            launch = planned
            await ask(client, server, WARM_UP)
        probes = await self._probe_set(client, server, (*PROBES, self._long))
        if not _runs(server, launch):
            self._serve_planned(server)
            return f"the engine died while it was measured: {_cause(server)}"
        if probes is None:
            return None
        pool = launch.lucebox.kvflash_pool if launch.lucebox is not None else None
        return ModeRate(trial.label, pool, probes, round(time.time(), 1))


def _runs(server: MeasuredRun, launch: ServerLaunch) -> bool:
    """Whether the engine running now is ``launch`` (not the one it fell back to)."""
    return server_argv(server.supervisor.launch) == server_argv(launch)


def _cause(server: MeasuredRun) -> str:
    cause = server.status.cause
    return cause.sentence if cause is not None else "it did not become ready"


def _kv_of(launch: ServerLaunch) -> tuple[str, int | None]:
    """The KV type and KVFlash pool a launch runs."""
    flags = launch.lucebox
    kv_type = (
        flags.cache_type if flags is not None and flags.cache_type else launch.plan.cache_type_k
    )
    return kv_type, flags.kvflash_pool if flags is not None else None
