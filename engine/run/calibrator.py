"""The calibration while a server runs: once no client has sent a request for a while, the
probe set with each configuration (a restart through the planner each), stored as it goes.

A client request abandons it at once: the probe in flight is cancelled, the configuration
running then serves the client, and the calibration resumes from the next configuration it
has no rate for once the server is idle again. The choice itself is
:mod:`lucebox.engine.run.calibration`'s.

Once measured, it watches the served requests: when their mix has moved clearly away from the
one the verdict was weighed by (:func:`lucebox.engine.plan.workload.mix_moved`), every
configuration is due again, measured once idle and weighed by the served mix, so speculation
switched off for one workload comes back on for another where it gains.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import httpx

from lucebox.engine.core.api import auth_headers
from lucebox.engine.core.errors import LuceboxError
from lucebox.engine.core.paths import Paths
from lucebox.engine.plan.measurements import (
    OFF,
    Measurement,
    MeasurementKey,
    ProbeRate,
    TrialRate,
    config_label,
    read_measurement,
    write_measurement,
)
from lucebox.engine.plan.specguard import SpecGuard
from lucebox.engine.plan.workload import MIX_REQUESTS, ServedRequest, mix_moved
from lucebox.engine.run import calibration
from lucebox.engine.run.calibration import Trial
from lucebox.engine.run.luceboxrun import reply_from_usage
from lucebox.engine.run.metrics import parse_counters
from lucebox.engine.run.probes import PROBES, Probe
from lucebox.engine.run.sample import SpecStatus

if TYPE_CHECKING:
    from lucebox.engine.machine.config import Settings
    from lucebox.engine.plan.launch import ServerLaunch
    from lucebox.engine.plan.launchplan import LaunchPlan
    from lucebox.engine.run.serverrun import ServerRun

CalibrationState = Literal["waiting", "running", "paused", "done"]
POLL_S = 0.25
"""How often the calibration looks for a client's request (a cancelled probe frees its slot
within a decode step)."""
READY_TIMEOUT_S = 900.0
PROBE_TIMEOUT_S = 300.0
"""One probe's reply at most: a configuration this slow loses anyway."""
WARM_UP = {"messages": [{"role": "user", "content": "Reply with one word."}], "max_tokens": 4}
"""Sent after each restart, not counted: the first steps of a fresh engine build its graphs."""


@dataclass(frozen=True)
class CalibrationSetup:
    """What one launch's calibration measures and how it re-plans (through the planner)."""

    key: MeasurementKey
    trials: tuple[Trial, ...]
    forced: bool
    """The user chose the mode: it is measured against none, and kept."""
    idle_s: float
    probe_max_tokens: int | None
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


class ProbeSender:
    """Sends the probe set to a serving engine once no client has asked for ``idle_s``, and
    gives way at once when one does (shared by the speculation and the engine calibration)."""

    def __init__(self, idle_s: float, probe_max_tokens: int | None) -> None:
        self.idle_s = idle_s
        self.probe_max_tokens = probe_max_tokens
        self.state: CalibrationState = "waiting"
        self._last_client_s = time.monotonic()
        self._last_look: tuple[float, float] | None = None
        """What the last look at client activity counted (compared with the next)."""

    async def _probe_set(
        self, client: httpx.AsyncClient, server: ServerRun, sent: Sequence[Probe] = PROBES
    ) -> tuple[ProbeRate, ...] | None:
        """Every probe's rate (a probe that fails counts no tokens); None when a client came."""
        self._last_look = None
        probes = []
        try:
            for probe in sent:
                if await self._client_seen(client, server, probing=False):
                    return None
                found = await self._probe(client, server, probe)
                if found is not None:
                    probes.append(found)
        except _ClientCameError:
            return None
        return tuple(probes)

    async def _probe(
        self, client: httpx.AsyncClient, server: ServerRun, probe: Probe
    ) -> ProbeRate | None:
        limit = self.probe_max_tokens
        max_tokens = min(limit, probe.max_tokens) if limit else probe.max_tokens
        body = {
            "messages": list(probe.messages),
            "max_tokens": max_tokens,
            "temperature": 0,
            "seed": 1,
        }
        task = asyncio.create_task(_ask(client, server, body))
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=POLL_S)
                if not task.done() and await self._client_seen(client, server, probing=True):
                    raise _ClientCameError
            timings = task.result()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                    await task
        self._last_look = None  # the probe's own tokens are not a client's
        if timings is None:
            return None
        return calibration.probe_rate(probe.name, timings, max_tokens)

    async def _client_seen(
        self, client: httpx.AsyncClient, server: ServerRun, *, probing: bool
    ) -> bool:
        """Whether a client's request runs or waits (or came since the last look). Behind the
        front its queue says so (the probes go to the engine's own port, never through it);
        an engine serving its address itself is asked for its slots and token counters."""
        if server.front is not None:
            busy, entered = server.front.queue.activity()
            before, self._last_look = self._last_look, (float(entered), 0.0)
            return busy > 0 or (before is not None and self._last_look != before)
        try:
            slots = (await client.get(f"{server.url}/slots")).json()
            metrics = (await client.get(f"{server.url}/metrics")).text
        except (httpx.HTTPError, ValueError):
            return False
        busy = sum(1 for s in slots if isinstance(s, dict) and s.get("is_processing"))
        counters = parse_counters(metrics)
        now = (
            counters.get("prompt_tokens_total", 0.0),
            counters.get("tokens_predicted_total", 0.0),
        )
        before, self._last_look = self._last_look, now
        if busy > (1 if probing else 0):
            return True
        return not probing and before is not None and now != before

    def _may_start(self) -> bool:
        """Whether measuring may begin (another calibration may have to finish first)."""
        return True

    async def _wait_idle(self, client: httpx.AsyncClient, server: ServerRun) -> None:
        """Until the engine is ready and no client has sent a request for ``idle_s``."""
        if self.state == "running":
            return
        self._last_look = None
        while True:
            ready = server.status.state == "ready" and self._may_start()
            if not ready or await self._client_seen(client, server, probing=False):
                self._last_client_s = time.monotonic()
            elif time.monotonic() - self._last_client_s >= self.idle_s:
                return
            await asyncio.sleep(POLL_S)


class Calibrator(ProbeSender):
    """One launch's calibration; ``run`` drives it inside a :class:`ServerRun`."""

    def __init__(self, paths: Paths, setup: CalibrationSetup) -> None:
        super().__init__(setup.idle_s, setup.probe_max_tokens)
        self.paths = paths
        self.setup = setup
        self.measurement = read_measurement(paths, setup.key) or Measurement(setup.key)
        self.state = "done" if self.complete else "waiting"
        self.trial: Trial | None = None
        """The configuration being measured now."""
        self.served: tuple[ServedRequest, ...] = ()
        """The latest requests served since the verdict, for the mix."""
        self._due = asyncio.Event()
        """Set when the served mix moved: a re-measure waits for an idle server."""

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

    @property
    def active(self) -> bool:
        """Measuring now: the speculation guard holds its judgement meanwhile."""
        return self.state == "running"

    def spec_view(self, label: str, sampled: SpecStatus | None) -> SpecStatus | None:
        """Speculation as status shows it: the sampler's view with the measured rate, or
        the measurement's own while it runs or when it switched speculation off."""
        again = self.measurement.remeasure_why
        if self.state in ("running", "paused") and self.trial is not None:
            if self.state == "running":
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

    async def run(self, server: ServerRun) -> None:
        """Measure what the store lacks, then serve what was chosen (one restart at most);
        again each time the served mix moves (a user's forced mode is kept anyway: not)."""
        while True:
            if self.state != "done":
                try:
                    await self._calibrate(server)
                except (OSError, LuceboxError) as exc:
                    self.state = "done"
                    server.supervisor.log.write(
                        f"# lucebox: speculation calibration stopped: {exc}"
                    )
                    return
            if self.setup.forced:
                return
            await self._due.wait()
            self._due.clear()

    def observe(self, requests: Sequence[ServedRequest]) -> None:
        """Requests the clients were served: once their mix has moved from the one the verdict
        was weighed by, every configuration is due again (measured once idle)."""
        verdict = self.measurement.chosen is not None
        if self.setup.forced or self.state != "done" or not verdict or not requests:
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

    async def _calibrate(self, server: ServerRun) -> None:
        headers = auth_headers(server.api_key)
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S, headers=headers) as client:
            while True:
                await self._wait_idle(client, server)
                running = running_label(server.supervisor.launch)
                todo = calibration.missing(self.setup.trials, self.measurement, running)
                if not todo:
                    break
                self.state, self.trial = "running", todo[0]
                rate = await self._measure(client, server, todo[0], running)
                if rate is None and todo[0] in self.setup.trials:  # not dropped: a client came
                    self.state, self._last_client_s = "paused", time.monotonic()
                if rate is None:
                    continue
                self._keep(self.measurement.with_trial(rate))
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
        self, client: httpx.AsyncClient, server: ServerRun, trial: Trial, running: str
    ) -> TrialRate | None:
        """``trial``'s rate over the probe set (a probe that fails counts no tokens); None when
        a client came, or when it could not start (it is dropped from this calibration)."""
        if trial.label != running:
            spec = self.setup.plan_trial(trial)
            self._last_look = None
            await self._client_seen(client, server, probing=False)  # what the next look compares
            if spec is None or not await _restart(server, spec):
                self.setup = replace(
                    self.setup, trials=tuple(t for t in self.setup.trials if t != trial)
                )
                return None
            warm_up = await _ask(client, server, WARM_UP)
            # Clients wait out a restart and are served first: the front counted them; an
            # engine without it counts their tokens.
            if server.front is not None:
                if await self._client_seen(client, server, probing=False):
                    return None
            elif await _served_besides(client, server.url, warm_up):
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


class _ClientCameError(Exception):
    """A client's request arrived while a probe ran."""


async def _served_besides(
    client: httpx.AsyncClient, url: str, timings: dict[str, object] | None
) -> bool:
    """Whether a new engine has generated more tokens than ``timings``' reply, its first."""
    own = timings.get("predicted_n") if timings else 0
    try:
        counters = parse_counters((await client.get(f"{url}/metrics")).text)
    except httpx.HTTPError:
        return False
    return counters.get("tokens_predicted_total", 0.0) > (own if isinstance(own, int) else 0)


async def _ask(
    client: httpx.AsyncClient, server: ServerRun, body: dict[str, object]
) -> dict[str, object] | None:
    """One greedy chat request of lucebox's own to ``server``'s engine; the engine's
    ``timings`` of the reply, None when it failed."""
    with server.supervisor.own_requests.sending() as answered:
        try:
            reply = await client.post(f"{server.url}/v1/chat/completions", json=body)
            timings = reply_timings(reply.json()) if reply.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        if reply.status_code == 200:
            answered.append(True)
        return timings


def reply_timings(document: object) -> dict[str, object] | None:
    """A chat reply's ``timings`` in llama-server's terms, whichever engine answered."""
    if not isinstance(document, dict):
        return None
    timings = document.get("timings")
    usage = document.get("usage")
    if timings is None and isinstance(usage, dict) and isinstance(usage.get("timings"), dict):
        try:
            timings = _lucebox_timings(usage)
        except (TypeError, ValueError):
            return None
    return timings if isinstance(timings, dict) else None


def _lucebox_timings(usage: dict[str, Any]) -> dict[str, object]:
    """The Lucebox engine's ``usage`` of a reply in llama-server's ``timings`` terms."""
    prompt, completion, prefill_s, decode_s, _ = reply_from_usage(usage)
    return {
        "prompt_n": prompt,
        "prompt_ms": prefill_s * 1000,
        # Its decode time counts every reply token; llama-server's the steps after the first.
        "predicted_n": completion,
        "predicted_ms": decode_s * 1000,
    }


async def _restart(server: ServerRun, launch: ServerLaunch) -> bool:
    """Restart ``server`` with ``launch``; whether its new engine became ready."""
    before = server.status.engine_pid
    server.restart(launch)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        status = server.status
        if status.state == "ready" and status.engine_pid not in (None, before):
            return True
        if status.state in ("failed", "stopped"):
            return False
        await asyncio.sleep(POLL_S)
    return False


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
        settings.calibrate_idle_s,
        settings.probe_max_tokens or None,
        launch.budget.is_gpu,
        plan_trial,
        plan_final,
    )
