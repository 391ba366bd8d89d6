"""The headless pipeline of `lucebox serve` (and `up --headless`): from GPU to a served model.

probe GPU -> choose preset -> models (pull + guards) -> engine (build if missing) -> plan ->
launch -> supervise + sample. The lock, the state file and the running server's stop and
restart are in :mod:`lucebox.engine.runstate`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lucebox.engine import config, gpu, guard, pipeline, registry, runstate, store, toolchain
from lucebox.engine.build import BuildEvent, choose_options
from lucebox.engine.errors import GuardRefusal
from lucebox.engine.launch import LaunchSpec, is_loopback, new_api_key
from lucebox.engine.paths import Paths
from lucebox.engine.plan import Plan
from lucebox.engine.presets import find_preset
from lucebox.engine.runstate import ServeLock as ServeLock
from lucebox.engine.runstate import ServerRun
from lucebox.engine.runstate import engine_log as engine_log
from lucebox.engine.runstate import state_of as state_of
from lucebox.engine.sample import Sample
from lucebox.engine.source import ensure_source
from lucebox.engine.supervisor import ServerEvent, Supervisor
from lucebox.engine.transfer import TransferProgress


@dataclass(frozen=True)
class ServeOptions:
    preset: str | None = None
    model: str | None = None
    ctx: int | None = None
    host: str | None = None
    port: int | None = None
    gpu_index: int | None = None
    allow_base: bool = False

    def to_args(self) -> list[str]:
        """The `lucebox serve` arguments that give these options."""
        pairs = [
            ("--preset", self.preset),
            ("--model", self.model),
            ("--ctx", self.ctx),
            ("--host", self.host),
            ("--port", self.port),
            ("--gpu", self.gpu_index),
        ]
        args = [item for flag, value in pairs if value is not None for item in (flag, str(value))]
        return [*args, "--allow-base"] if self.allow_base else args


StepName = Literal["gpu", "preset", "models", "engine", "plan", "server"]
STEPS: tuple[StepName, ...] = ("gpu", "preset", "models", "engine", "plan", "server")
StepState = Literal["running", "done", "failed", "note"]


@dataclass(frozen=True)
class StepEvent:
    """Progress of one pipeline step: what the CLI prints as a line and the TUI as a checklist."""

    step: StepName
    state: StepState
    message: str
    fraction: float | None = None
    """0..1 of a download or build while it runs."""
    rate_bytes_per_s: float | None = None
    eta_s: float | None = None


@dataclass(frozen=True)
class Prepared:
    """Everything decided before the engine starts."""

    spec: LaunchSpec
    model: str
    """The served model's name (the preset id, or the file's stem)."""
    gpu_index: int
    device: str
    engine_version: str
    plan: Plan
    available_bytes: int
    ready_timeout_s: float


Emit = Callable[[StepEvent], None]


def _download_progress(emit: Emit) -> Callable[[TransferProgress], None]:
    def report(event: TransferProgress) -> None:
        emit(
            StepEvent(
                "models",
                "running",
                f"downloading {event.name}",
                event.fraction,
                event.rate_bytes_per_s,
                event.eta_s,
            )
        )

    return report


def _build_progress(emit: Emit) -> Callable[[BuildEvent], None]:
    def report(event: BuildEvent) -> None:
        if event.percent is not None:
            emit(StepEvent("engine", "running", "building the engine", event.percent / 100))

    return report


def prepare(paths: Paths, options: ServeOptions, emit: Emit) -> Prepared:
    """Every step before the engine starts: GPU, preset, models, engine, plan (blocking I/O)."""
    settings = config.load_settings(paths)
    emit(StepEvent("gpu", "running", "looking for an NVIDIA GPU"))
    probe = gpu.probe_gpus()
    gpu_index = options.gpu_index if options.gpu_index is not None else settings.gpu_index
    budget = pipeline.budget_for(probe, gpu_index)
    emit(StepEvent("gpu", "done", f"{budget.device}, {budget.free_bytes / 2**30:.1f} GiB free"))
    allow_base = options.allow_base or settings.allow_base
    preset = None
    if options.model:
        target_source = options.model
        emit(StepEvent("preset", "done", f"no preset: serving {target_source}"))
    else:
        emit(StepEvent("preset", "running", "choosing the model set"))
        preset_id = options.preset or settings.preset
        # A named preset needs no planning here: the plan below reads the file itself.
        preset = (
            find_preset(paths, preset_id)
            if preset_id
            else pipeline.pick_preset(paths, budget, None).preset
        )
        emit(StepEvent("preset", "done", f"{preset.id} ({preset.title})"))
        target_source = preset.target.source

    emit(StepEvent("models", "running", f"looking for {target_source}"))
    target_path = pipeline.local_file(paths, target_source)
    if target_path is None:
        target_path = store.pull_model(
            paths, target_source, on_progress=_download_progress(emit)
        ).main_path
    emit(StepEvent("models", "done", f"{target_path.name} is here"))
    emit(StepEvent("engine", "running", "looking for an installed engine"))
    selection = registry.select_engine(paths, probe, settings.engine)
    engine = selection.engine
    if engine is None:
        emit(StepEvent("engine", "note", "none installed: building it (this takes a while once)"))
        choice = choose_options(probe, toolchain.probe_cuda_toolkit())
        engine, _ = registry.build_and_install(
            paths, ensure_source(paths), choice.options, on_event=_build_progress(emit)
        )
    emit(StepEvent("engine", "done", f"{engine.id} ({engine.version})"))
    archs = registry.known_model_archs(paths, registry.EngineSelection(engine, ""))
    emit(StepEvent("models", "running", f"checking {target_path.name} for this engine"))
    template = preset.chat_template if preset else None
    checked = guard.check_model(
        target_path,
        allow_base=allow_base or bool(template),
        template_supplied=bool(template),
        known_archs=archs,
    )
    for problem in checked.problems:
        emit(StepEvent("models", "note", f"{problem.severity} {problem.code}: {problem.message}"))
    if not checked.usable:
        raise GuardRefusal(
            f"{target_path.name} was refused by the model check", hint="see the problems above"
        )
    spec_type = draft_path = None
    draft_max = None
    if preset is not None and preset.draft is not None:
        spec_type, draft_max = preset.draft.spec_type, preset.draft.draft_max
        if preset.draft.model is not None:
            draft_file = pipeline.local_file(paths, preset.draft.model.source)
            if draft_file is None:
                draft_file = store.pull_model(
                    paths, preset.draft.model.source, on_progress=_download_progress(emit)
                ).main_path
            draft_result, _ = guard.check_pair(
                draft_file,
                target_path,
                known_archs=archs,
                spec_types=engine.capabilities.spec_types,
            )
            if draft_result.usable:
                draft_path = str(draft_file)
            else:
                emit(StepEvent("models", "note", "draft refused by its guard: no speculation"))
                spec_type = None
    emit(StepEvent("models", "done", target_path.name + (" + draft" if draft_path else "")))
    emit(StepEvent("plan", "running", "sizing context and KV cache"))
    facts = pipeline.facts_for(paths, target_path, engine, checked.info)
    ctx = options.ctx or settings.ctx or None
    plan = pipeline.plan_model(facts, budget, ctx, engine)
    if not plan.fits:
        raise GuardRefusal(
            f"the plan does not fit: {plan.reasons.get('ctx', '')}",
            hint=f"the largest context that fits is {plan.largest_ctx} tokens",
        )
    emit(
        StepEvent(
            "plan",
            "done",
            f"ctx {plan.ctx}, KV {plan.cache_type_k}, "
            f"{plan.memory_bytes.total / 2**30:.2f} GiB of {budget.free_bytes / 2**30:.1f} GiB",
        )
    )
    host = options.host or settings.host
    api_key = settings.api_key or None
    if not is_loopback(host) and api_key is None:
        api_key = new_api_key()
        config.set_setting(paths, "server.api_key", api_key)
        emit(
            StepEvent("server", "note", f"API key (shown once, saved as server.api_key): {api_key}")
        )
    spec = LaunchSpec(
        server_path=engine.server_path,
        model_path=str(target_path),
        plan=plan,
        alias=preset.id if preset else target_path.stem,
        host=host,
        port=options.port or settings.port,
        chat_template=template,
        draft_path=draft_path,
        spec_type=spec_type,
        draft_max=draft_max,
        api_key=api_key,
        sampling=tuple(sorted(preset.sampling.items())) if preset else (),
    )
    # Loading reads the whole file: allow a minute per GiB on top of two minutes.
    ready_timeout_s = 120 + 60 * target_path.stat().st_size / 2**30
    return Prepared(
        spec,
        spec.alias,
        gpu_index,
        budget.device,
        engine.version,
        plan,
        budget.free_bytes,
        ready_timeout_s,
    )


def smaller_context(spec: LaunchSpec) -> LaunchSpec | None:
    """Re-plan at three quarters of the context after an out-of-memory start."""
    ctx = (spec.plan.ctx * 3 // 4) // 256 * 256
    if ctx < 2048:
        return None
    return dataclasses.replace(spec, plan=dataclasses.replace(spec.plan, ctx=ctx))


def new_supervisor(paths: Paths, prepared: Prepared) -> Supervisor:
    return Supervisor(
        prepared.spec,
        engine_log(paths),
        ready_timeout_s=prepared.ready_timeout_s,
        replan_on_oom=smaller_context,
    )


def server_run(paths: Paths, prepared: Prepared, supervisor: Supervisor) -> ServerRun:
    """The run that supervises ``supervisor``'s engine, samples it and keeps the state file."""
    return ServerRun(paths, supervisor, model=prepared.model, gpu_index=prepared.gpu_index)


def run_server(
    paths: Paths, prepared: Prepared, supervisor: Supervisor
) -> AsyncIterator[ServerEvent | Sample]:
    """The events and samples of :func:`server_run`, for a front end that only watches."""
    return server_run(paths, prepared, supervisor).events()


def start_detached(paths: Paths, options: ServeOptions) -> tuple[int, Path]:
    """Start `lucebox serve` with ``options`` in the background; its pid and log."""
    return runstate.start_detached(paths, options.to_args())


def serve(paths: Paths, options: ServeOptions, emit: Emit) -> int:
    """Run the pipeline in the foreground until SIGINT/SIGTERM or a crash loop."""
    lock = ServeLock(paths)
    try:
        prepared = prepare(paths, options, emit)
        return asyncio.run(_serve_headless(paths, prepared, emit))
    finally:
        lock.release()


async def _serve_headless(paths: Paths, prepared: Prepared, emit: Emit) -> int:
    run = server_run(paths, prepared, new_supervisor(paths, prepared))
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, run.stop)
    exit_code = 0
    async for item in run.events():
        if isinstance(item, ServerEvent):
            state: StepState = "failed" if item.kind in ("gave-up", "exited") else "running"
            emit(StepEvent("server", state, f"{item.kind}: {item.message}"))
            if item.kind == "gave-up":
                exit_code = 1
    return exit_code
