"""The engine calibration while a server runs, where both engines can serve the launch: once
idle, the probe set on each engine (each with its best speculation as measured), stored as it
goes, then the faster for the served mix serves (plan/engineverdict.py): one switch at most,
at an idle moment, through the one planner.

It watches the served requests as the speculation calibration does: once their mix has moved
``MIX_SHIFT`` from the one the verdict was weighed by, or their sampling from the one measured at
(the probes send the served mix's sampling, and verdicts are stored by it), both engines are due
again and the verdict may flip back. Where the two come close, both run the probes again before
the verdict stands (``engineverdict.needs_another_run``). A forced ``--engine`` is measured
against the other and kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import httpx

from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import kinds
from lucebox.engine.engines.registry import KindName
from lucebox.engine.plan import engineverdict
from lucebox.engine.plan.engineverdict import EngineCost, EngineMeasurement
from lucebox.engine.plan.speculation.measurements import TrialRate
from lucebox.engine.plan.speculation.workload import (
    MIN_MIX_REQUESTS,
    MIX_REQUESTS,
    ProbeShape,
    ServedRequest,
    mix_moved,
    served_mix,
)
from lucebox.engine.run.calibrate.calibrator import running_label
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
    from lucebox.engine.plan.speculation.specguard import SpecGuard


@dataclass(frozen=True)
class EngineSetup:
    """What one launch's engine calibration measures and how it re-plans."""

    key: str
    forced: KindName | None
    """The engine the user forced (``--engine``): measured against the other, and kept."""
    pace: ProbePace
    """When it may probe: the speculation calibration goes first."""
    plan_engine: Callable[[KindName | None], tuple[ServerLaunch, str] | None]
    """The launch on that engine and its speculation reason, through the planner (None: the
    planner's own choice, which reads the verdict from the store); None when it cannot start."""
    guard_for: Callable[[ServerLaunch], SpecGuard | None]
    """The speculation guard of a launch the verdict serves."""


class EngineCalibrator(ProbeSender[KindName]):
    """One launch's engine calibration; ``run`` drives it inside a :class:`MeasuredRun`."""

    def __init__(self, paths: Paths, setup: EngineSetup) -> None:
        super().__init__(setup.pace)
        self.paths = paths
        self.setup = setup
        found = engineverdict.read_engines(paths, setup.key)
        self.measurement = found or EngineMeasurement(setup.key)
        self.state = "done" if self.complete else "waiting"
        self.kind: KindName | None = None
        """The engine being measured now."""
        self.costs: tuple[EngineCost, ...] = ()
        """What the mix cost on each engine at the last verdict."""
        self.switches = 0
        """Verdicts that changed the engine serving clients: one switch per verdict at most
        (the restarts to measure the other engine are the calibration's own)."""
        self.served: tuple[ServedRequest, ...] = ()
        """The latest requests the clients were served, for the mix."""
        self._dropped: set[KindName] = set()
        self._again: set[KindName] = set()
        """Engines due another run of the probes: the verdict was too close to stand."""

    @property
    def complete(self) -> bool:
        todo = self.measurement.unmeasured()
        return not todo and (self.setup.forced is not None or self.measurement.chosen is not None)

    what = "engine calibration"

    def _forced(self) -> bool:
        return self.setup.forced is not None

    def observe(self, requests: Sequence[ServedRequest]) -> None:
        """Requests the clients were served: the next verdict weighs them, and once their mix
        moved from the one the verdict was weighed by, both engines are due again."""
        if self.setup.forced or not requests:
            return
        if self.state == "done" and self._sampling_moved():
            self.served, self.state = (), "waiting"
            self._due.set()
            return
        self.served = (*self.served, *requests)[-MIX_REQUESTS:]
        base = self._base()
        if self.state != "done" or self.measurement.chosen is None or base is None:
            return
        shapes = base.shapes()
        weighed = dict(self.measurement.mix) or _probe_shares(shapes)
        moved = mix_moved(self.served, shapes, weighed, by_requests=True)
        if moved is None:
            return
        mix, _ = moved
        at = round(time.time(), 1)
        self._keep(replace(self.measurement, mix=tuple(sorted(mix.items())), remeasure_at=at))
        self.state = "waiting"
        self._due.set()

    def _todo(self, server: MeasuredRun) -> Sequence[KindName]:
        self._follow_sampling(server)
        running = server.supervisor.launch.kind
        due = {*self.measurement.unmeasured(), *self._again}
        todo = [k for k in engineverdict.ENGINE_KINDS if k in due and k not in self._dropped]
        return sorted(todo, key=lambda k: k != running)

    def _follow_sampling(self, server: MeasuredRun) -> None:
        """Probe at the sampling the front's requests got; its verdict is stored apart."""
        at = self._served_sampling(server)
        key = engineverdict.at_sampling(self.setup.key, at) if at is not None else self.setup.key
        if key != self.setup.key:
            self.setup = replace(self.setup, key=key)
            self.measurement = engineverdict.read_engines(self.paths, key) or EngineMeasurement(key)
            self._again.clear()

    def _sampling_moved(self) -> bool:
        """The served requests' sampling is no longer the one the verdict was measured at."""
        now = self._sampling_now()
        return now is not None and engineverdict.at_sampling(self.setup.key, now) != self.setup.key

    async def _measure_one(
        self, client: httpx.AsyncClient, server: MeasuredRun, kind: KindName
    ) -> bool:
        self.kind = kind
        trial = await self._measure(client, server, kind)
        if trial is None:
            return kind in self._dropped  # dropped: it could not start
        earlier = self.measurement.trial(kind) if kind in self._again else None
        self._again.discard(kind)
        self._keep(self.measurement.with_trial(kind, earlier.with_run(trial) if earlier else trial))
        return True

    async def _calibrate(self, server: MeasuredRun) -> None:
        serving = server.supervisor.launch.kind
        await self._measure_all(server)
        while not self._dropped and self._too_close():
            self._again = set(engineverdict.ENGINE_KINDS)
            await self._measure_all(server)
        self.kind = None
        weighed = self.served if len(self.served) >= MIN_MIX_REQUESTS else ()
        if not self._dropped:
            chosen, why, self.costs = engineverdict.verdict(self.measurement, weighed)
            base = self._base()
            mix = served_mix(weighed, base.shapes(), by_requests=True) if weighed and base else {}
            if self.setup.forced is None:
                self._keep(
                    replace(self.measurement, chosen=chosen, why=why, mix=tuple(mix.items()))
                )
        # An engine that could not start leaves the planner's choice (the store's verdict or
        # the rule), which is started again: the failed start may have left none running.
        self.served, self.state = (), "done"
        final = self.setup.plan_engine(self.setup.forced)
        if final is None:
            return
        launch, reason = final
        self.switches += int(launch.kind != serving)
        server.serve_measured(launch, reason, self.setup.guard_for(launch))

    def _too_close(self) -> bool:
        """Whether the engines' costs over the mix are too close for one more run to be spared."""
        weighed = self.served if len(self.served) >= MIN_MIX_REQUESTS else ()
        _, _, costs = engineverdict.verdict(self.measurement, weighed)
        return engineverdict.needs_another_run(costs)

    def _base(self) -> TrialRate | None:
        """llama-server's trial, whose probe shapes the served requests are matched to."""
        return self.measurement.trial(kinds.LLAMA_SERVER.name)

    def _keep(self, measurement: EngineMeasurement) -> None:
        self.measurement = measurement
        engineverdict.write_engines(self.paths, measurement)

    async def _measure(
        self, client: httpx.AsyncClient, server: MeasuredRun, kind: KindName
    ) -> TrialRate | None:
        """``kind``'s rates over the probe set; None when a client came, or when it could not
        start (it is dropped from this calibration)."""
        launch = server.supervisor.launch
        if kind != launch.kind:
            planned = self.setup.plan_engine(kind)
            if planned is None or not await restart_into(server, planned[0]):
                self._dropped.add(kind)
                return None
            launch = planned[0]
            await ask(client, server, WARM_UP)
        probes = await self._probe_set(client, server)
        if probes is None:
            return None
        label = f"{kind} {running_label(launch)}"
        return TrialRate(
            label,
            launch.spec_type,
            launch.draft_max,
            launch.draft_p_min,
            probes,
            round(time.time(), 1),
        )


def _probe_shares(shapes: Sequence[ProbeShape]) -> dict[str, float]:
    """The probes' own mix by requests: each probe one request."""
    return {p.name: 1 / len(shapes) for p in shapes} if shapes else {}
