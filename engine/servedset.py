"""The pipeline of a served set: several models on one endpoint through llama-server's router.

The same steps as one model's (pipeline.py): GPU, models (each pulled and checked), engine, plan
(plan/servedset/servedsetplan.py: every model by the one planner against one budget per device),
then the router, supervised like the single server, on a loopback port behind lucebox's proxy
(run/servedset/servedsetproxy.py), which frees memory by the plans before a model loads. A model
that runs out of memory is planned again here (plan/servedset/memberreplan.py) and its section of
the preset file rewritten; the run (run/servedset/servedsetrun.py) has the router re-read it. One
model, named once, never comes here.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

from lucebox.engine.core import units
from lucebox.engine.core.api import auth_headers
from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.paths import Paths
from lucebox.engine.machine import config
from lucebox.engine.machine.personkeys import keys_path
from lucebox.engine.machine.ports import next_free_port, port_holder
from lucebox.engine.pipeline import (
    Emit,
    ServeOptions,
    StepEvent,
    StepState,
    ensure_engine,
    machine_view,
    pull_source,
    server_api_key,
)
from lucebox.engine.plan import chatdefaults
from lucebox.engine.plan.engineview import EngineView
from lucebox.engine.plan.launch import url_of
from lucebox.engine.plan.options import side_models_of
from lucebox.engine.plan.servedset.memberreplan import respecced_set, smaller_context_set
from lucebox.engine.plan.servedset.router import router_ini, router_launch
from lucebox.engine.plan.servedset.servedsetplan import plan_set
from lucebox.engine.plan.servedset.setplan import SetPlan, SetRefusal, members_of
from lucebox.engine.plan.servedset.setsides import device_key, device_room_bytes
from lucebox.engine.plan.speculation.specguard import Decision
from lucebox.engine.run.calibrate.calibrator import running_label
from lucebox.engine.run.death import port_taken
from lucebox.engine.run.front.apishape import Shapes
from lucebox.engine.run.front.frontguard import server_policy
from lucebox.engine.run.hang import bounds_for
from lucebox.engine.run.runstate import ServeLock, engine_log
from lucebox.engine.run.servedset.admission import Placement
from lucebox.engine.run.servedset.servedsetguard import ModelSpec
from lucebox.engine.run.servedset.servedsetproxy import start_proxy
from lucebox.engine.run.servedset.servedsetrun import PlannedModel, ServedSetRun
from lucebox.engine.run.servedset.servedsetslots import SetSlots, model_slots, set_slot_folder
from lucebox.engine.run.servedsetmodels import ModelNote
from lucebox.engine.run.sideserver import side_route
from lucebox.engine.run.supervision.serverevent import ServerEvent
from lucebox.engine.run.supervisor import (
    PortInUseError,
    Supervisor,
)
from lucebox.engine.runstart import keep_guard_off

LOOPBACK = "127.0.0.1"

ROUTER_READY_TIMEOUT_S = 60.0
"""The router answers /health as soon as it listens; models load later, on request."""


@dataclass(frozen=True)
class PreparedSet:
    planned: SetPlan
    settings: config.Settings


def prepare_set(
    paths: Paths,
    options: ServeOptions,
    sources: tuple[str, ...],
    emit: Emit,
    *,
    dry_run: bool,
    cancel: threading.Event | None = None,
) -> PreparedSet:
    """Every step before the router starts; ``dry_run`` fetches and builds nothing; setting
    ``cancel`` stops a download between reads (the TUI's quit)."""
    emit(StepEvent("gpu", "running", "looking for an NVIDIA GPU"))
    view = machine_view(paths, options)
    settings, budget, installs = view.settings, view.budget, view.installs
    emit(
        StepEvent("gpu", "done", f"{budget.device}, {units.gib_text(budget.vram_free_bytes)} free")
    )
    emit(StepEvent("preset", "done", f"a set of {len(sources)}: {', '.join(sources)}"))
    if not dry_run:
        for member in members_of(paths, sources):
            preset = member.preset
            pull_source(paths, preset.target.source if preset else member.source, emit, cancel)
            if preset and preset.draft and preset.draft.model:
                pull_source(paths, preset.draft.model.source, emit, cancel)
        for _role, source in side_models_of(options, view.settings):
            pull_source(paths, source, emit, cancel)
        installed = ensure_engine(paths, view.probe, settings.engine_id, emit)
        installs = replace(installs, llama_server=EngineView.of(installed))
        paths.ensure(paths.slots_dir)
    emit(StepEvent("plan", "running", "planning the set: which fit together, and where"))
    planned = plan_set(
        paths,
        options,
        sources,
        settings=settings,
        budget=budget,
        installs=installs,
        ram_limit_bytes=settings.models_ram_mib * units.MIB,
    )
    if planned.refusal is not None:
        raise SetRefusal(planned, planned.refusal)
    emit(StepEvent("models", "done", ", ".join(lp.target.path.name for lp in planned.launches)))
    emit(StepEvent("plan", "done", set_summary(planned)))
    return PreparedSet(planned, settings)


def set_summary(planned: SetPlan) -> str:
    each = ", ".join(
        f"{lp.alias} ctx {lp.plan.ctx} {units.gib_text(lp.plan.memory_bytes.total, 2)}"
        for lp in planned.launches
    )
    sides = "".join(
        f"; {m.role} {m.alias} {units.gib_text(m.memory_bytes, 2)}" for m in planned.sides.models
    )
    return f"{each}; at most {planned.models_max} loaded at once{sides}"


def planned_models(planned: SetPlan) -> tuple[PlannedModel, ...]:
    return tuple(
        PlannedModel(
            lp.alias,
            lp.budget.device,
            lp.server.model_path,
            lp.plan.memory_bytes.total + planned.process_bytes,
            lp.budget.is_gpu,
            lp.plan.ctx,
            ModelSpec(
                lp.server.spec_type,
                lp.server.draft_max,
                lp.speculation.reason,
                guarded=lp.resolved.spec == "auto",
                shortened=lp.options.draft_max is not None,
            ),
        )
        for lp in planned.launches
    )


def serve_set(paths: Paths, options: ServeOptions, sources: tuple[str, ...], emit: Emit) -> int:
    """Serve the set in the foreground until SIGINT/SIGTERM or a crash loop."""
    lock = ServeLock(paths)
    try:
        prepared = prepare_set(paths, options, sources, emit, dry_run=False)
        return asyncio.run(_serve_router(paths, prepared, emit))
    finally:
        lock.release()


def placements_of(planned: SetPlan) -> tuple[dict[str, Placement], dict[str, int]]:
    """Each model's device and planned bytes, and each device's room, for the proxy: the
    side models' bytes are not the set's to load models into."""
    placements = {
        lp.alias: Placement(device_key(lp), lp.plan.memory_bytes.total + planned.process_bytes)
        for lp in planned.launches
    }
    keys = {p.device for p in placements.values()}
    room = {key: device_room_bytes(planned.budget, key) for key in keys}
    if planned.sides.models:
        room[device_key(planned.launches[0])] -= sum(m.memory_bytes for m in planned.sides.models)
    return placements, room


def shapes_of(planned: SetPlan) -> dict[str, Shapes]:
    """Each model's API shaping for the proxy: its alias, planned context and thinking default
    (the router's processes are llama-server's)."""
    return {
        lp.alias: Shapes(
            "llama-server",
            lp.alias,
            lp.plan.ctx,
            chatdefaults.thinking_default(lp.target.facts.architecture),
            lp.sampling,
        )
        for lp in planned.launches
    }


@contextlib.asynccontextmanager
async def router_run(
    paths: Paths, prepared: PreparedSet, emit: Emit
) -> AsyncIterator[ServedSetRun]:
    """The set's run, not yet started: its router's preset file written and lucebox's proxy
    listening on the served address until the block ends. Iterating the run's events serves."""
    planned = prepared.planned
    ini_path = paths.ensure(paths.runtime_dir) / "router.ini"
    # The models' processes refuse to start when their slot folder is missing.
    slot_folder = paths.ensure(set_slot_folder(paths.slots_dir, planned.aliases))
    write_text_atomic(ini_path, router_ini(planned, slot_folder))
    public = planned.launches[0].server
    # The router counts no models: the proxy in front of it evicts by memory.
    spec = replace(router_launch(planned, str(ini_path), 0), host=LOOPBACK, port=_free_port())
    api_key = None
    if spec.api_key_file:
        api_key = server_api_key(paths, prepared.settings, emit)
    placements, room = placements_of(planned)
    shapes = shapes_of(planned)
    try:
        policy = server_policy(
            public.host,
            public.port,
            api_key,
            keys_path(paths),
            prepared.settings.allowed_origins,
        )
        server, clients, gate = await start_proxy(
            public.host,
            public.port,
            url_of(spec),
            placements,
            room,
            auth_headers(api_key),
            policy,
            shapes,
            tuple(side_route(side, api_key) for side in planned.sides.models),
            (slot_folder, model_slots(planned)),
        )
    except OSError as exc:
        holder = port_holder(public.host, public.port) or "another program"
        raise PortInUseError(
            f"cannot listen on {public.host}:{public.port}: {exc.strerror or exc} ({holder})",
            hint=port_taken(
                public.port, holder, next_free_port(public.host, public.port)
            ).next_step,
        ) from exc
    supervisor = Supervisor(spec, engine_log(paths), ready_timeout_s=ROUTER_READY_TIMEOUT_S)
    gate.slots.note = lambda line: supervisor.log.write(f"# lucebox: {line}")
    idle_s = prepared.settings.models_idle_s
    idling = asyncio.create_task(gate.unload_idle(idle_s)) if idle_s > 0 else None

    served = _RouterSet(paths, prepared.settings, planned, ini_path, placements, shapes, gate.slots)
    try:
        yield ServedSetRun(
            paths,
            supervisor,
            planned=planned_models(planned),
            public_url=url_of(public),
            api_key=api_key,
            replan_on_oom=served.after_oom,
            respec=served.after_spec,
            hang_bounds=bounds_for(prepared.settings.hang_s),
            in_flight=gate.in_flight,
            sides=planned.sides.models,
            save_slots=gate.slots.save_loaded,
            slot_words=lambda: gate.slots.last,
        )
    finally:
        if idling is not None:
            idling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await idling
        server.close()
        for client in clients:
            await client.aclose()


@dataclass
class _RouterSet:
    """The set a router serves, and its re-plans: each writes the router's preset file again
    and updates the proxy's mappings in place (it admits by the new bytes from then on, and
    says the new context)."""

    paths: Paths
    settings: config.Settings
    planned: SetPlan
    """The set as last planned."""
    ini_path: Path
    placements: dict[str, Placement]
    """The proxy's own mapping of each model's device and bytes."""
    shapes: dict[str, Shapes]
    """The proxy's own mapping of each model's API shaping."""
    slots: SetSlots
    """The proxy's saved slots: a model planned again saves and restores by its new key."""

    async def after_oom(self, alias: str) -> tuple[PlannedModel, ...]:
        smaller = await asyncio.to_thread(
            smaller_context_set, self.paths, self.planned, alias, self.settings
        )
        return self._serve(smaller)

    async def after_spec(self, alias: str, decision: Decision) -> tuple[PlannedModel, ...]:
        planned = self.planned
        changed = await asyncio.to_thread(
            respecced_set, self.paths, planned, alias, self.settings, decision
        )
        if decision.action == "off":
            launch = planned.launches[planned.aliases.index(alias)]
            label = running_label(launch.server)
            await asyncio.to_thread(keep_guard_off, self.paths, launch, label, decision.reason)
        return self._serve(changed)

    def _serve(self, planned: SetPlan) -> tuple[PlannedModel, ...]:
        write_text_atomic(self.ini_path, router_ini(planned, self.slots.folder))
        self.placements.update(placements_of(planned)[0])
        self.slots.models.update(model_slots(planned))
        self.shapes.update(shapes_of(planned))
        self.planned = planned
        return planned_models(planned)


async def _serve_router(paths: Paths, prepared: PreparedSet, emit: Emit) -> int:
    aliases = ", ".join(prepared.planned.aliases)
    exit_code = 0
    async with router_run(paths, prepared, emit) as run:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, run.stop)
        async for item in run.events():
            if isinstance(item, ServerEvent):
                state: StepState = "failed" if item.kind == "gave-up" else "running"
                emit(StepEvent("server", state, f"{item.kind}: {item.message}"))
                if item.kind == "ready":
                    emit(StepEvent("server", "note", f"models: {aliases}"))
                if item.kind == "gave-up":
                    exit_code = 1
            elif isinstance(item, ModelNote):
                emit(StepEvent("server", "note", item.message))
    return exit_code


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])
