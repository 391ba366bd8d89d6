"""The calibration while a server runs: once no client has sent a request for a while, the
probe set with each configuration (a restart through the planner each), stored as it goes.

A client request abandons it at once: the probe in flight is cancelled, the configuration
running then serves the client, and the calibration resumes from the next configuration it
has no rate for once the server is idle again. The choice itself is
:mod:`lucebox.engine.run.calibrate.calibration`'s.

Once measured, it watches the served requests: when their mix has moved clearly away from the
one the verdict was weighed by (:func:`lucebox.engine.plan.speculation.workload.mix_moved`), every
configuration is due again, measured once idle and weighed by the served mix, so speculation
switched off for one workload comes back on for another where it gains.

Where the two fastest come too close to call (``calibration.too_close``), both run the probes
again before the verdict stands, each run kept beside the earlier ones for their spread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import httpx

from lucebox.engine.core.paths import Paths
from lucebox.engine.plan import samplingdefaults
from lucebox.engine.plan.speculation.measurements import (
    OFF,
    Measurement,
    MeasurementKey,
    TrialRate,
    config_label,
    read_measurement,
    write_measurement,
)
from lucebox.engine.plan.speculation.specguard import SpecGuard
from lucebox.engine.plan.speculation.workload import MIX_REQUESTS, ServedRequest, mix_moved
from lucebox.engine.run.calibrate import calibration
from lucebox.engine.run.calibrate.calibration import Trial
from lucebox.engine.run.calibrate.probing import (
    WARM_UP,
    MeasuredRun,
    ProbePace,
    ProbeSender,
    ask,
    restart_into,
    served_besides,
)
from lucebox.engine.run.sample import SamplingRate, SamplingStatus, SpecStatus

if TYPE_CHECKING:
    from lucebox.engine.machine.config import Settings
    from lucebox.engine.plan.launch import ServerLaunch
    from lucebox.engine.plan.launchplan import LaunchPlan


@dataclass(frozen=True)
class CalibrationSetup:
    """What one launch's calibration measures and how it re-plans (through the planner)."""

    key: MeasurementKey
    trials: tuple[Trial, ...]
    forced: bool
    """The user chose the mode: it is measured against none, and kept."""
    pace: ProbePace
    on_gpu: bool
    plan_trial: Callable[[Trial], ServerLaunch | None]
    plan_final: Callable[[], tuple[ServerLaunch, str] | None]
    """The launch once measured and its speculation reason: under auto the planner reads the
    verdict from the store."""

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(t.label for t in self.trials)


def running_label(server: ServerLaunch) -> str:
    return config_label(server.spec_type, server.draft_max, server.draft_p_min)


class Calibrator(ProbeSender[Trial]):
    """One launch's calibration; ``run`` drives it inside a :class:`MeasuredRun`."""

    def __init__(self, paths: Paths, setup: CalibrationSetup) -> None:
        super().__init__(setup.pace)
        self.paths = paths
        self.setup = setup
        self.measurement = read_measurement(paths, setup.key) or Measurement(setup.key)
        self.state = "done" if self.complete else "waiting"
        self.trial: Trial | None = None
        """The configuration being measured now."""
        self.served: tuple[ServedRequest, ...] = ()
        """The latest requests served since the verdict, for the mix."""
        self._elsewhere: dict[str, Measurement | None] = {}
        """What the store holds at the samplings this calibration does not measure at now."""
        self.close: calibration.CloseCall | None = None
        """The two configurations running the probes again: too close to call so far."""
        self._again: set[str] = set()
        """Those of ``close`` yet to run again."""

    @property
    def complete(self) -> bool:
        todo = calibration.missing(self.setup.trials, self.measurement, OFF)
        return not todo and (self.setup.forced or self.measurement.chosen is not None)

    def guard_for(self, server: ServerLaunch, *, shortened: bool = False) -> SpecGuard | None:
        """The speculation guard of ``server``, judging throughput against the measured rate."""
        if server.spec_type is None:
            return None
        return SpecGuard.for_launch(
            server.spec_type,
            server.draft_max,
            self.setup.on_gpu,
            shortened=shortened,
            baseline=self.measurement.baseline_curve(),
        )

    def spec_view(self, label: str, sampled: SpecStatus | None) -> SpecStatus | None:
        """Speculation as status shows it: the sampler's view with the measured rate, or
        the measurement's own while it runs or when it switched speculation off."""
        again = self.measurement.remeasure_why
        if self.state in ("running", "paused") and self.trial is not None:
            if self.state == "running" and self.close is not None:
                runs = self.measurement.rate_spread(self.trial.label)[1] + 1
                reason = f"measuring again on this card: {self.trial.label} (run {runs} of at "
                reason += f"most {calibration.MAX_RUNS}), because {self.close.text()}"
            elif self.state == "running":
                fresh = sum(1 for t in self.setup.trials if self.measurement.fresh(t.label))
                reason = "re-measuring" if again else "measuring"
                reason += f" on this card: {self.trial.label} ("
                reason += f"{fresh} of {len(self.setup.trials)} measured)"
                reason += f", because {again}" if again else ""
            else:
                reason = f"measuring paused at {self.trial.label} for a client's request; "
                reason += "it resumes once idle"
            base = sampled or SpecStatus(self.trial.spec_type or OFF, None, "", None, None)
            return replace(base, reason=reason)
        shown = self._measured_view(label, sampled)
        if shown is None or self.state != "waiting" or not again:
            return shown
        return replace(shown, reason=f"{shown.reason}; re-measuring once idle, because {again}")

    def _measured_view(self, label: str, sampled: SpecStatus | None) -> SpecStatus | None:
        """The sampler's view with the measured rate, or the measurement's when it chose off."""
        if label == OFF and self.measurement.chosen == OFF:
            planned = next((t.label for t in self.setup.trials if t.label != OFF), None)
            shown = calibration.shown_off(self.measurement, planned) if planned else None
            return shown or sampled
        if label == OFF:
            return sampled  # switched off after the calibration chose to speculate
        measured = calibration.measured_rate(self.measurement, label)
        if sampled is None or measured is None:
            return sampled
        return replace(sampled, measured=measured)

    def sampling_rates(self, label: str, mix: SamplingStatus | None) -> tuple[SamplingRate, ...]:
        """Greedy and sampled replies apart: ``label``'s speed-up as measured at each sampling
        (the store keeps them apart) and the acceptance the front counted."""
        sampled = calibration.sampled_at(mix, self.setup.key.sampling)
        measured = {at: self._measured_at(at) for at in (samplingdefaults.GREEDY, sampled) if at}
        return calibration.by_sampling(measured, label, mix, sampled)

    def _measured_at(self, sampling: str) -> Measurement | None:
        """What the store holds at ``sampling`` (read once; this calibration's own as kept)."""
        if sampling == self.setup.key.sampling:
            return self.measurement
        if sampling not in self._elsewhere:
            key = replace(self.setup.key, sampling=sampling)
            self._elsewhere[sampling] = read_measurement(self.paths, key)
        return self._elsewhere[sampling]

    what = "speculation calibration"

    def _forced(self) -> bool:
        return self.setup.forced

    def _follow_mix(self, server: MeasuredRun) -> None:
        """Measure at the sampling the front's requests got (greedy, or the mix's typical
        temperature): the probes send it and the rates go to that sampling's entry."""
        at = self._served_sampling(server)
        if at is not None and at != self.setup.key.sampling:
            self.setup = replace(self.setup, key=replace(self.setup.key, sampling=at))
            key = self.setup.key
            self.measurement = read_measurement(self.paths, key) or Measurement(key)
            self._elsewhere.clear()
            self.close, self._again = None, set()

    def _mix_moved(self) -> bool:
        """The served requests' sampling is no longer the one measured at."""
        now = self._sampling_now()
        return now is not None and now != self.setup.key.sampling

    def observe(self, requests: Sequence[ServedRequest]) -> None:
        """Requests the clients were served: once their mix (shapes or sampling) has moved
        from the one the verdict was weighed by, every configuration is due again (measured
        once idle)."""
        verdict = self.measurement.chosen is not None
        if self.setup.forced or self.state != "done" or not verdict or not requests:
            return
        if self._mix_moved():
            self.served, self.state = (), "waiting"
            self._due.set()
            return
        self.served = (*self.served, *requests)[-MIX_REQUESTS:]
        base = self.measurement.baseline
        if base is None:
            return
        moved = mix_moved(self.served, base.shapes(), self.measurement.weighed_mix())
        if moved is None:
            return
        mix, why = moved
        self._keep(self.measurement.remeasure(mix, why, round(time.time(), 1)))
        self.served, self.state = (), "waiting"
        self._due.set()

    def _todo(self, server: MeasuredRun) -> Sequence[Trial]:
        self._follow_mix(server)
        running = running_label(server.supervisor.launch)
        return calibration.missing(self.setup.trials, self.measurement, running, self._again)

    async def _measure_one(
        self, client: httpx.AsyncClient, server: MeasuredRun, trial: Trial
    ) -> bool:
        self.trial = trial
        running = running_label(server.supervisor.launch)
        rate = await self._measure(client, server, trial, running)
        if rate is None:
            return trial not in self.setup.trials  # dropped: it could not start
        earlier = self.measurement.trial(trial.label)
        if trial.label in self._again and earlier is not None:
            rate = earlier.with_run(rate)
        self._again.discard(trial.label)
        self._keep(self.measurement.with_trial(rate))
        return True

    async def _calibrate(self, server: MeasuredRun) -> None:
        await self._measure_all(server)
        while not self.setup.forced:
            self.close = calibration.too_close(self.measurement, self.setup.labels)
            if self.close is None:
                break
            self._again = set(self.close.labels)
            await self._measure_all(server)
        self.trial = None
        if not self.setup.forced:
            chosen, why = calibration.verdict(self.measurement, self.setup.labels)
            self._keep(replace(self.measurement, chosen=chosen, why=why))
        self.state = "done"
        final = self.setup.plan_final()
        if final is not None:
            spec, reason = final
            server.serve_measured(spec, reason, self.guard_for(spec))

    def keep_guard_off(self, label: str, why: str) -> None:
        """The guard switched ``label`` off while serving: kept in the store, so a restart
        does not serve it again (until the served mix moves)."""
        self._keep(self.measurement.with_guard_off(label, why))

    def _keep(self, measurement: Measurement) -> None:
        self.measurement = measurement
        write_measurement(self.paths, measurement)

    async def _measure(
        self, client: httpx.AsyncClient, server: MeasuredRun, trial: Trial, running: str
    ) -> TrialRate | None:
        """``trial``'s rate over the probe set (a probe that fails counts no tokens); None when
        a client came, or when it could not start (it is dropped from this calibration)."""
        if trial.label != running:
            spec = self.setup.plan_trial(trial)
            self._last_look = None
            await self._client_seen(client, server, probing=False)  # what the next look compares
            if spec is None or not await restart_into(server, spec):
                self.setup = replace(
                    self.setup, trials=tuple(t for t in self.setup.trials if t != trial)
                )
                return None
            warm_up = await ask(client, server, WARM_UP)
            # Clients wait out a restart and are served first: the front counted them; an
            # engine without it counts their tokens.
            if server.front is not None:
                if await self._client_seen(client, server, probing=False):
                    return None
            elif await served_besides(client, server.url, warm_up):
                return None
        probes = await self._probe_set(client, server)
        if probes is None:
            return None
        return TrialRate(
            trial.label,
            trial.spec_type,
            trial.draft_max,
            trial.p_min,
            probes,
            round(time.time(), 1),
        )


def setup_for(
    launch: LaunchPlan,
    settings: Settings,
    plan_trial: Callable[[Trial], ServerLaunch | None],
    plan_final: Callable[[], tuple[ServerLaunch, str] | None],
) -> CalibrationSetup | None:
    """What ``launch`` measures; None when nothing can speculate or calibration is off."""
    key = launch.speculation.measurement_key
    candidates = launch.speculation.candidates
    mode = launch.resolved.spec
    if key is None or not candidates or mode == "off" or settings.calibrate_idle_s <= 0:
        return None
    forced = mode != "auto"
    return CalibrationSetup(
        key,
        calibration.trials_for(candidates, forced=forced),
        forced,
        ProbePace(settings.calibrate_idle_s, settings.probe_max_tokens or None),
        launch.budget.is_gpu,
        plan_trial,
        plan_final,
    )
