"""What every calibration shares: the run it measures (:class:`MeasuredRun`), the probe sender
that gives way to clients, lucebox's own requests to the engine, and the restart into a
configuration through the run's one way to restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar

import httpx

from lucebox.engine.core.api import auth_headers
from lucebox.engine.core.errors import LuceboxError
from lucebox.engine.plan import samplingdefaults
from lucebox.engine.plan.speculation.measurements import ProbeRate
from lucebox.engine.run.calibrate import calibration
from lucebox.engine.run.calibrate.probes import PROBES, Probe
from lucebox.engine.run.front.samplingmix import probe_fields
from lucebox.engine.run.kinds.luceboxrun import reply_from_usage
from lucebox.engine.run.kinds.metrics import parse_counters

if TYPE_CHECKING:
    from lucebox.engine.plan.launch import ServerLaunch
    from lucebox.engine.plan.speculation.specguard import SpecGuard
    from lucebox.engine.run.front.front import Front
    from lucebox.engine.run.front.samplingmix import SamplingMix
    from lucebox.engine.run.runstate import Status
    from lucebox.engine.run.supervisor import Supervisor

CalibrationState = Literal["waiting", "running", "paused", "done"]
POLL_S = 0.25
"""How often the calibration looks for a client's request (a cancelled probe frees its slot
within a decode step)."""
READY_TIMEOUT_S = 900.0
PROBE_TIMEOUT_S = 300.0
"""One probe's reply at most: a configuration this slow loses anyway."""
GREEDY_PROBE: Mapping[str, Any] = probe_fields(None, None)
"""Greedy, with a fixed seed."""
WARM_UP = {"messages": [{"role": "user", "content": "Reply with one word."}], "max_tokens": 4}
"""Sent after each restart, not counted: the first steps of a fresh engine build its graphs."""


@dataclass(frozen=True)
class ProbePace:
    """When a calibration may send its probes, and how long their replies may be."""

    idle_s: float
    """How long no client must have sent a request first."""
    probe_max_tokens: int | None = None
    """A cap on each probe's reply; None: the probe's own."""
    before: Callable[[], bool] = lambda: True
    """Whether it may start: another calibration may have to finish first."""


class MeasuredRun(Protocol):
    """What a calibration needs of the run it measures (:class:`~lucebox.engine.run.serverrun.
    serverrun.ServerRun` is one): the engine's own address and key, its status and supervisor,
    the front whose queue says when a client comes, and the run's one way to restart or serve a
    choice."""

    url: str
    front: Front | None
    supervisor: Supervisor

    @property
    def api_key(self) -> str | None: ...

    @property
    def status(self) -> Status: ...

    def restart(self, server: ServerLaunch | None = None) -> None: ...

    def hold_clients(self, held: bool) -> None: ...

    async def keep_conversation(self) -> None:
        """Save a client's conversation the engine's slot holds before a probe takes it."""

    def serve_measured(
        self, server: ServerLaunch, reason: str, guard: SpecGuard | None
    ) -> None: ...


_Item = TypeVar("_Item")
"""What one calibration measures one at a time: a configuration, an engine kind, a mode."""


class ProbeSender(Generic[_Item]):
    """Sends the probe set to a serving engine once no client has asked for ``idle_s``, and
    gives way at once when one does; the run loop every calibration shares."""

    client_timeout_s = PROBE_TIMEOUT_S
    """How long one of its own requests may take."""
    probe_sampling: Mapping[str, Any] = GREEDY_PROBE
    """The sampling fields each probe sends: greedy until :meth:`_served_sampling` follows the
    served mix (every calibration's rates are stored by sampling)."""
    mix: SamplingMix | None = None
    """The front's tally of the sampling its requests got (live); None without a front."""

    def __init__(self, pace: ProbePace) -> None:
        self.pace = pace
        self.state: CalibrationState = "waiting"
        self._last_client_s = time.monotonic()
        self._last_look: tuple[float, float] | None = None
        """What the last look at client activity counted (compared with the next)."""
        self._due = asyncio.Event()
        """Set when the served mix moved: a re-measure waits for an idle server."""

    async def _probe_set(
        self, client: httpx.AsyncClient, server: MeasuredRun, sent: Sequence[Probe] = PROBES
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
        self, client: httpx.AsyncClient, server: MeasuredRun, probe: Probe
    ) -> ProbeRate | None:
        limit = self.pace.probe_max_tokens
        max_tokens = min(limit, probe.max_tokens) if limit else probe.max_tokens
        body = {
            "messages": list(probe.messages),
            "max_tokens": max_tokens,
            **self.probe_sampling,
        }
        task = asyncio.create_task(ask(client, server, body))
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
        self, client: httpx.AsyncClient, server: MeasuredRun, *, probing: bool
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

    def _served_sampling(self, server: MeasuredRun) -> str | None:
        """Probe at the sampling the front's requests got (greedy, or the mix's typical
        temperature): the probes send it from now on; the label its measurements are stored
        under, or None for an engine serving its own address (the probes stay greedy)."""
        served = served_sampling(server)
        if served is None or server.front is None:
            return None
        self.mix = server.front.sampling
        self.probe_sampling, at = served
        return at

    def _sampling_now(self) -> str | None:
        """The label of the sampling the served requests get now; None before the front's
        tally is known."""
        if self.mix is None:
            return None
        return samplingdefaults.label(float(self.mix.probe_fields()["temperature"]))

    @property
    def active(self) -> bool:
        """Measuring now: the served requests are the probes', the speculation guard holds
        its judgement meanwhile."""
        return self.state == "running"

    what = "calibration"
    """What the engine log calls this measurement when it stops."""

    async def run(self, server: MeasuredRun) -> None:
        """Measure what the store lacks, then serve what was chosen (one restart at most);
        again each time it is due (``_due``), unless the user forced the choice."""
        while True:
            if self.state != "done":
                try:
                    await self._calibrate(server)
                except (OSError, LuceboxError) as exc:
                    self.state = "done"
                    server.supervisor.log.write(f"# lucebox: {self.what} stopped: {exc}")
                    return
            if self._forced():
                return
            await self._due.wait()
            self._due.clear()

    async def _calibrate(self, server: MeasuredRun) -> None:
        """Measure what is missing, then act on it (serve the verdict)."""
        await self._measure_all(server)

    async def _measure_all(self, server: MeasuredRun) -> None:
        """Each item left to measure, the first of :meth:`_todo` each time the server is idle
        again; a client that comes pauses it until the next idle moment."""
        headers = auth_headers(server.api_key)
        async with httpx.AsyncClient(timeout=self.client_timeout_s, headers=headers) as client:
            while True:
                await self._wait_idle(client, server)
                todo = self._todo(server)
                if not todo:
                    return
                self.state = "running"
                if not await self._measure_one(client, server, todo[0]):
                    self.state, self._last_client_s = "paused", time.monotonic()

    def _todo(self, server: MeasuredRun) -> Sequence[_Item]:
        """What is left to measure, what runs now first (no restart for it)."""
        return ()

    async def _measure_one(
        self, client: httpx.AsyncClient, server: MeasuredRun, item: _Item
    ) -> bool:
        """Measure ``item`` and keep what it gave; False when a client came meanwhile."""
        raise NotImplementedError

    def _forced(self) -> bool:
        """The user forced the choice: measured once, never again."""
        return False

    async def _wait_idle(self, client: httpx.AsyncClient, server: MeasuredRun) -> None:
        """Until the engine is ready and no client has sent a request for ``idle_s``."""
        if self.state == "running":
            return
        self._last_look = None
        while True:
            ready = server.status.state == "ready" and self.pace.before()
            if not ready or await self._client_seen(client, server, probing=False):
                self._last_client_s = time.monotonic()
            elif time.monotonic() - self._last_client_s >= self.pace.idle_s:
                return
            await asyncio.sleep(POLL_S)


def served_sampling(server: MeasuredRun) -> tuple[dict[str, Any], str] | None:
    """The sampling fields of the front's served mix (its typical temperature, or greedy) and
    the label its measurements are stored under; None for an engine serving its own address."""
    if server.front is None:
        return None
    fields = server.front.sampling.probe_fields()
    return fields, samplingdefaults.label(float(fields["temperature"]))


class _ClientCameError(Exception):
    """A client's request arrived while a probe ran."""


async def served_besides(
    client: httpx.AsyncClient, url: str, timings: dict[str, object] | None
) -> bool:
    """Whether a new engine has generated more tokens than ``timings``' reply, its first."""
    own = timings.get("predicted_n") if timings else 0
    try:
        counters = parse_counters((await client.get(f"{url}/metrics")).text)
    except httpx.HTTPError:
        return False
    return counters.get("tokens_predicted_total", 0.0) > (own if isinstance(own, int) else 0)


async def ask(
    client: httpx.AsyncClient, server: MeasuredRun, body: dict[str, object]
) -> dict[str, object] | None:
    """One chat request of lucebox's own to ``server``'s engine (a client's
    conversation in its slot is saved first); the engine's ``timings`` of the reply, None
    when it failed."""
    await server.keep_conversation()
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


async def restart_into(server: MeasuredRun, launch: ServerLaunch) -> bool:
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
