"""A served set's run: the router supervised like a single server, its models watched.

The router has no ``/slots`` and wants ``?model=`` on ``/metrics``, so the single server's
sampler does not apply; instead the run asks ``/models`` once a second, follows the changes
(and load progress) the router announces on ``/models/sse`` as they come, and keeps each
model's state, memory and last use in the state file that `lucebox status` reads. It also
loads and unloads a model on request (the dashboard's keys). A model whose process dies out
of memory is planned again once at a smaller context, as a single server is: the router
re-reads its preset file and loads it again on the next request; the other models run on.
Each speculating model runs the speculation guard on its own process's counters
(:mod:`servedsetguard`); its decision re-plans that model alone, which the router loads again
with the new flags. Its stop saves each loaded model's slot first (through the proxy's
:class:`~servedsetslots.SetSlots`), as a single server's stop saves its one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import httpx
import psutil

from lucebox.engine.core.api import CallError, auth_headers
from lucebox.engine.core.errors import GuardRefusal
from lucebox.engine.core.paths import Paths
from lucebox.engine.machine.gpu import NvmlProvider
from lucebox.engine.plan.sidemodels import SideModel
from lucebox.engine.plan.speculation.specguard import Decision
from lucebox.engine.run.death import log_cause
from lucebox.engine.run.gpustatus import gpu_statuses, nvml_session
from lucebox.engine.run.hang import DEFAULT_BOUNDS, HangBounds
from lucebox.engine.run.runsetup import RunFacts
from lucebox.engine.run.runstate import write_slot_save
from lucebox.engine.run.sample import SpecStatus
from lucebox.engine.run.servedset.routerlist import ModelListError, error_message
from lucebox.engine.run.servedset.servedsetguard import NO_SPEC, ChildSpecGuard, ModelSpec
from lucebox.engine.run.servedset.servedsethang import (
    ChildHangWatch,
    child_client,
    look_at_child,
)
from lucebox.engine.run.servedsetmodels import (
    ModelNote,
    ModelsSample,
    ModelStateName,
    ModelStatus,
    child_line,
    failed_children,
    loaded_children,
    proxied_model,
    router_change,
    router_states,
)
from lucebox.engine.run.serverrun.serverrun import RunItem, ServerRun
from lucebox.engine.run.supervision.serverevent import ServerEvent

if TYPE_CHECKING:
    from lucebox.engine.run.supervisor import Supervisor

POLL_S = 1.0
LOAD_TIMEOUT_S = 120.0
"""A load through the proxy first waits for the models it evicts to exit (up to a minute)."""
UNLOAD_TIMEOUT_S = 30.0
ROUTER_NOTICE_S = 5.0
"""How long the router may take to see a killed model process exit."""
NOTICE_POLL_S = 0.1
CHILD_LINES = 60
"""The last lines of each model process kept for the diagnosis, as many as a single server's."""


@dataclass(frozen=True)
class PlannedModel:
    """What the set's plan says of one model: where it runs and what it may use."""

    alias: str
    device: str
    model_path: str
    planned_bytes: int
    on_gpu: bool
    ctx: int = 0
    """The context its plan serves, in tokens."""
    spec: ModelSpec = NO_SPEC
    """Its speculation as planned."""


ReplanOnOom = Callable[[str], Awaitable[tuple[PlannedModel, ...]]]
"""Plans one model of the set again at a smaller context and rewrites the router's preset
file; the set's models after it. Raises GuardRefusal when it must not shrink."""
Respec = Callable[[str, Decision], Awaitable[tuple[PlannedModel, ...]]]
"""Plans one model of the set again after the speculation guard's decision and rewrites the
router's preset file; the set's models after it. Raises GuardRefusal when that cannot start."""


def child_memory_bytes(router_pid: int) -> dict[str, int]:
    """Resident memory of each of the router's model processes, by the model path they run."""
    found: dict[str, int] = {}
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(router_pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                argv = child.cmdline()
                for flag in ("-m", "--model"):
                    if flag in argv[:-1]:
                        found[argv[argv.index(flag) + 1]] = child.memory_info().rss
    return found


def model_statuses(
    planned: tuple[PlannedModel, ...],
    states: dict[str, ModelStateName],
    memory: dict[str, int],
    last_used: dict[str, float],
    now_s: float,
    progress: Mapping[str, float] | None = None,
    specs: Mapping[str, SpecStatus | None] | None = None,
    slots: Mapping[str, str] | None = None,
) -> tuple[ModelStatus, ...]:
    """Each planned model's status from the router's states, its processes, the load
    progress the router announced, its speculation and its slot's last save or restore
    (pure)."""
    statuses = []
    for model in planned:
        state = states.get(model.alias, "unloaded")
        running = state in ("loaded", "loading", "sleeping")
        held = memory.get(model.model_path, 0) if running else 0
        if model.on_gpu and state in ("loaded", "loading"):
            held = model.planned_bytes  # the card's share is the plan's; NVML has no per-child view
        used = last_used.get(model.alias)
        statuses.append(
            ModelStatus(
                alias=model.alias,
                state=state,
                device=model.device,
                memory_bytes=held,
                last_used_s=round(now_s - used, 1) if used is not None else None,
                planned_bytes=model.planned_bytes,
                load_progress=(progress or {}).get(model.alias) if state == "loading" else None,
                spec=(specs or {}).get(model.alias),
                last_slot=(slots or {}).get(model.alias),
            )
        )
    return tuple(statuses)


class ServedSetRun(ServerRun):
    """The router's run: supervision, stop and restart as a single server's; models watched."""

    def __init__(
        self,
        paths: Paths,
        supervisor: Supervisor,
        *,
        planned: tuple[PlannedModel, ...],
        public_url: str,
        api_key: str | None = None,
        replan_on_oom: ReplanOnOom | None = None,
        respec: Respec | None = None,
        hang_bounds: HangBounds | None = DEFAULT_BOUNDS,
        in_flight: Callable[[], frozenset[str]] = frozenset,
        sides: tuple[SideModel, ...] = (),
        save_slots: Callable[[], Awaitable[Mapping[str, str]]] | None = None,
        slot_words: Callable[[], Mapping[str, str]] = dict,
    ) -> None:
        aliases = ", ".join(m.alias for m in planned)
        facts = RunFacts(
            model=aliases, gpu_index=0, api_key=api_key, hang_bounds=hang_bounds, sides=sides
        )  # the side models' servers start, restart and show in status as a single model's
        super().__init__(paths, supervisor, facts)
        self._hang_watch = ChildHangWatch(hang_bounds) if hang_bounds is not None else None
        """Each loaded model's process watched for a request that makes no progress."""
        self.in_flight = in_flight
        """The models answering a request through the set's proxy now: only their processes
        are looked at (any request to a process, a look too, keeps it from sleeping)."""
        self.planned = planned
        self.public_url = public_url
        self.save_slots = save_slots
        """Saves the slot of each loaded model, awaited before the router stops on purpose:
        why each save that failed did, by alias; raises ModelListError when the router lists
        no models."""
        self.slot_words = slot_words
        """What the last save or restore of each model's slot did, for status."""
        self.replan_on_oom = replan_on_oom
        self.respec = respec
        self._spec_guard = ChildSpecGuard(
            {m.alias: m.spec for m in planned}, {m.alias: m.on_gpu for m in planned}
        )
        """Each speculating model's guard, fed from its own process."""
        self._answering_before: frozenset[str] = frozenset()
        """The models in flight at the last poll: each gets one look after its request ends."""
        self._child_lines: dict[int, deque[str]] = {}
        """The last lines of each model process, by its port (the router's prefix)."""
        self._failed_seen: set[str] = set()
        """Models whose present failure was dealt with (the router keeps showing it)."""
        self._replanned: set[str] = set()
        """Models already planned again after running out of memory: never twice."""
        self._last_used: dict[str, float] = {}
        self._states: dict[str, ModelStateName] = {}
        self._progress: dict[str, float] = {}
        self._nvml: NvmlProvider | None = None
        """NVML while the run samples: the cards' memory and load go into status."""
        self._changes = 0
        """How many changes the router has announced on /models/sse."""
        self._run.status = replace(
            self._run.status,
            url=public_url,
            models=model_statuses(planned, {}, {}, {}, time.time()),
        )

    @property
    def served_aliases(self) -> tuple[str, ...]:
        return tuple(m.alias for m in self.planned)

    def _feed_line(self, engine_pid: int, line: str) -> None:
        super()._feed_line(engine_pid, line)
        name = proxied_model(line)
        if name is not None:
            self._last_used[name] = time.time()
        relayed = child_line(line)
        if relayed is not None:
            port, text = relayed
            self._child_lines.setdefault(port, deque(maxlen=CHILD_LINES)).append(text)

    async def events(self) -> AsyncIterator[RunItem]:
        """The run's events as a single server's, its messages naming the served address
        rather than the router's own loopback one."""
        async for item in super().events():
            if isinstance(item, ServerEvent):
                item = replace(item, message=item.message.replace(self.url, self.public_url))
            yield item

    async def load(self, alias: str) -> None:
        """Load ``alias`` through lucebox's proxy on the served address, which first unloads
        the least recently used models its device needs the room of, as for a request.

        Raises:
            CallError: the proxy or the router refused (already running, no room) or did
                not answer.
        """
        await self._ask(f"{self.public_url}/models/load", alias, "load", LOAD_TIMEOUT_S)

    async def unload(self, alias: str) -> None:
        """Unload ``alias`` through lucebox's proxy, which saves its slot first; the router's
        endpoint then stops its process.

        Raises:
            CallError: the router refused (not running) or did not answer.
        """
        await self._ask(f"{self.public_url}/models/unload", alias, "unload", UNLOAD_TIMEOUT_S)

    async def _engine_stopping(self) -> None:
        """Before the router stops on purpose: sampling ends, then each loaded model's slot is
        saved, so the set's next start restores the conversations; the saves that failed are
        recorded for `lucebox down` to say, as a single server's; so is a router that lists
        no models, whose conversations then go unsaved."""
        await super()._engine_stopping()
        if self._engine_ready and self.save_slots is not None:
            try:
                failed = await self.save_slots()
            except ModelListError as exc:
                said = f"could not list the set's models: {exc}; conversations not saved"
                self.supervisor.log.write(f"# lucebox: {said}")
            else:
                said = "; ".join(f"{alias}: {why}" for alias, why in failed.items())
            write_slot_save(self.paths, said or None)

    async def _ask(self, url: str, alias: str, verb: str, timeout_s: float) -> None:
        headers = auth_headers(self.api_key)
        async with httpx.AsyncClient(timeout=timeout_s, headers=headers) as client:
            try:
                answer = await client.post(url, json={"model": alias})
            except httpx.HTTPError as exc:
                raise CallError(f"cannot {verb} {alias}: {url} did not answer ({exc})") from exc
        if answer.is_error:
            raise CallError(f"cannot {verb} {alias}: {error_message(answer)}")

    async def _sample(self, engine_pid: int, queue: asyncio.Queue[RunItem | None]) -> None:
        with nvml_session() as nvml:
            self._nvml = nvml
            await self._poll_models(engine_pid, queue)

    async def _poll_models(self, engine_pid: int, queue: asyncio.Queue[RunItem | None]) -> None:
        async with (
            httpx.AsyncClient(timeout=5.0, headers=auth_headers(self.api_key)) as client,
            child_client(5.0) as children,
        ):
            following = asyncio.create_task(self._follow_changes(client, engine_pid, queue))
            try:
                while True:
                    payload: Any = None
                    changes = self._changes
                    with contextlib.suppress(httpx.HTTPError, ValueError):
                        payload = (await client.get(self.url + "/models")).json()
                    if changes == self._changes:  # else the answer may predate a change shown
                        self._states = router_states(payload)
                    if payload is not None:  # an unanswered poll says nothing of the models
                        notes = await self._after_failures(client, failed_children(payload))
                        loaded = loaded_children(payload)
                        notes += await self._watch_children(client, children, loaded)
                        for note in notes:
                            self.supervisor.log.write(f"# lucebox: {note.message}")
                            await queue.put(note)
                    await self._publish(engine_pid, queue)
                    await asyncio.sleep(POLL_S)
            finally:
                following.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await following

    async def _after_failures(
        self, client: httpx.AsyncClient, failed: dict[str, int | None]
    ) -> list[ModelNote]:
        """What the run does about each model that newly failed: one that ran out of memory
        (by its process's last lines) is planned again once, at a smaller context."""
        self._failed_seen &= failed.keys()  # a model loaded again may fail again
        notes = []
        for alias, port in failed.items():
            if alias in self._failed_seen:
                continue
            self._failed_seen.add(alias)
            # Read once: the port may serve another process later.
            lines = list(self._child_lines.pop(port, ())) if port is not None else []
            replan = self.replan_on_oom
            cause = log_cause(lines)
            if cause is not None and cause.code == "gpu-out-of-memory" and replan is not None:
                notes.append(ModelNote(alias, await self._replan(client, alias, replan)))
        return notes

    async def _watch_children(
        self, client: httpx.AsyncClient, looker: httpx.AsyncClient, children: dict[str, int]
    ) -> list[ModelNote]:
        """The loaded models (alias -> port) looked at once for both watches: the hang watch
        (:mod:`servedsethang`) judges those answering a request, the speculation guard
        (:mod:`servedsetguard`) those too, those that just answered and those whose decision
        waits for an idle moment. Only they are asked: any request to a model's process, a
        look too, keeps it from sleeping. ``looker`` asks them (it keeps no idle connection,
        :func:`servedsethang.child_client`); ``client`` asks the router."""
        answering = self.in_flight()
        looked = answering
        if self.respec is not None:
            looked |= self._answering_before | self._spec_guard.pending()
        self._answering_before = answering
        looks = {a: await look_at_child(looker, p) for a, p in children.items() if a in looked}
        notes = []
        if self._hang_watch is not None:
            busy = {a: look for a, look in looks.items() if a in answering}
            for alias, why in self._hang_watch.check(busy, self.supervisor.pid):
                await self._until_not_loaded(client, alias)
                notes.append(
                    ModelNote(
                        alias,
                        f"{alias} hung: {why}; its process was stopped, the waiting request "
                        "ended with an error, and the next request loads it again",
                    )
                )
        if self.respec is not None:
            for alias, decision in self._spec_guard.check(looks):
                notes.append(
                    ModelNote(alias, await self._respec(client, alias, decision, self.respec))
                )
        return notes

    async def _until_not_loaded(self, client: httpx.AsyncClient, alias: str) -> None:
        """Until the router has seen ``alias``'s process exit (a request sent before would go
        to the dead process), within a few seconds."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(ROUTER_NOTICE_S):
                while True:
                    with contextlib.suppress(httpx.HTTPError, ValueError):
                        answer = await client.get(self.url + "/models")
                        if router_states(answer.json()).get(alias) != "loaded":
                            return
                    await asyncio.sleep(NOTICE_POLL_S)

    async def _respec(
        self, client: httpx.AsyncClient, alias: str, decision: Decision, respec: Respec
    ) -> str:
        """``alias`` planned again after the guard's decision and the router told to re-read
        its preset file, which stops the running models whose section changed (this one
        alone), so its next load takes the new flags; a sentence."""
        try:
            self.planned = await respec(alias, decision)
        except GuardRefusal as refused:
            return f"{alias}: {decision.observed}; kept as it is ({refused.message})"
        if decision.action == "off":
            self._spec_guard.switched_off(alias, decision)
        self._spec_guard.replanned({m.alias: m.spec for m in self.planned})
        failed = await self._reload_presets(client)
        if failed is not None:
            return (
                f"{alias}: {decision.reason}; the router did not take the new plan ({failed}), "
                "so it serves as before until the set restarts"
            )
        return f"{alias}: {decision.reason}; it loads so on the next request"

    async def _reload_presets(self, client: httpx.AsyncClient) -> httpx.HTTPError | None:
        """Tell the router to re-read its preset file; what failed, None when it did."""
        try:
            answer = await client.get(self.url + "/models", params={"reload": "1"})
            answer.raise_for_status()
        except httpx.HTTPError as exc:
            return exc
        return None

    async def _replan(self, client: httpx.AsyncClient, alias: str, replan: ReplanOnOom) -> str:
        """``alias`` planned again after running out of memory, and the router told to re-read
        its preset file (which clears the failure and restarts no other model); a sentence."""
        if alias in self._replanned:
            return (
                f"{alias} ran out of memory again after it was planned at a smaller context: "
                "left failed (free memory, or serve the set without it)"
            )
        self._replanned.add(alias)
        try:
            self.planned = await replan(alias)
        except GuardRefusal as refused:
            return f"{alias} ran out of memory: left failed ({refused.message}; {refused.hint})"
        ctx = next(m.ctx for m in self.planned if m.alias == alias)
        failed = await self._reload_presets(client)
        if failed is not None:
            return (
                f"{alias} ran out of memory: planned at {ctx} tokens, but the router did not "
                f"re-read its presets ({failed}), so it stays failed"
            )
        return (
            f"{alias} ran out of memory: planned again at a {ctx}-token context; it loads "
            "again on the next request"
        )

    async def _follow_changes(
        self, client: httpx.AsyncClient, engine_pid: int, queue: asyncio.Queue[RunItem | None]
    ) -> None:
        """Each change the router announces, shown at once: a load lasts a fraction of a
        second on a small model, far less than the poll, and only here has its progress."""
        while True:
            with contextlib.suppress(httpx.HTTPError):
                limits = httpx.Timeout(5.0, read=None)  # the stream is quiet between changes
                async with client.stream("GET", self.url + "/models/sse", timeout=limits) as sse:
                    async for line in sse.aiter_lines():
                        change = router_change(line)
                        if change is None:
                            continue
                        self._changes += 1
                        self._states[change.alias] = change.state
                        self._progress.pop(change.alias, None)
                        if change.load_progress is not None:
                            self._progress[change.alias] = change.load_progress
                        await self._publish(engine_pid, queue)
            await asyncio.sleep(POLL_S)  # the router restarted, or is not up yet

    async def _publish(self, engine_pid: int, queue: asyncio.Queue[RunItem | None]) -> None:
        """The models now into the state file and the run's items; their memory is read
        again each time, so a model shown loaded shows what it holds."""
        memory = await asyncio.to_thread(child_memory_bytes, engine_pid)
        specs = {m.alias: self._spec_guard.status(m.alias) for m in self.planned}
        models = model_statuses(
            self.planned,
            self._states,
            memory,
            self._last_used,
            time.time(),
            self._progress,
            specs,
            self.slot_words(),
        )
        gpus = gpu_statuses(self._nvml) if self._nvml is not None else ()
        self._run.status = replace(self._run.status, models=models, gpus=gpus)
        self._save()
        await queue.put(ModelsSample(models, gpus))
