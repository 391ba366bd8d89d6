"""The headless pipeline of `lucebox serve` (and `up --headless`): from GPU to a served model.

probe GPU -> choose preset -> models (pull + guards) -> engine (build if missing) -> plan ->
launch -> supervise + sample. The lock, the state file and the running server's stop and
restart are in :mod:`lucebox.engine.run.runstate`.

``prepare`` stays one function: it reads as the checklist's steps in order, emitting each, so
the CLI's lines and the TUI's checklist follow it one to one.
"""

from __future__ import annotations

import asyncio
import functools
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from lucebox.engine.core import units
from lucebox.engine.core.downloadprogress import TransferProgress
from lucebox.engine.core.errors import CancelledByUserError, LuceboxError
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import install, kinds, registry, toolchain, update, webui
from lucebox.engine.engines.build import BuildEvent, cpu_options, estimate_left_s
from lucebox.engine.engines.kinds import LLAMA_SERVER, EngineKind
from lucebox.engine.engines.registry import EngineManifest, KindName
from lucebox.engine.machine import config, gpu, peers
from lucebox.engine.machine.apikey import ensure_api_key_file
from lucebox.engine.machine.budget import GpuBudget, budget_for
from lucebox.engine.machine.peers import Peer
from lucebox.engine.models import guard
from lucebox.engine.models.projector import ProjectorInfo
from lucebox.engine.models.pull import pull_model
from lucebox.engine.models.records import list_models
from lucebox.engine.plan import chatdefaults, measurements, planner, presetchoice, repoplan
from lucebox.engine.plan.engineview import EngineView
from lucebox.engine.plan.launch import ServerLaunch
from lucebox.engine.plan.launchplan import LaunchPlan, PlanRefusal
from lucebox.engine.plan.luceboxplan import PREFILL_DRAFTER_SOURCE
from lucebox.engine.plan.measurements import Measurement
from lucebox.engine.plan.memory import Plan
from lucebox.engine.plan.modelfiles import local_file
from lucebox.engine.plan.options import Resolved, resolve
from lucebox.engine.plan.options import ServeOptions as ServeOptions
from lucebox.engine.plan.specguard import Decision, SpecGuard
from lucebox.engine.run import calibrator
from lucebox.engine.run.calibration import Trial
from lucebox.engine.run.death import EngineDeath
from lucebox.engine.run.enginecalibrator import EngineCalibrator, EngineSetup
from lucebox.engine.run.runstate import ServeLock, engine_log
from lucebox.engine.run.sample import PeerStatus
from lucebox.engine.run.serverrun import ServerRun
from lucebox.engine.run.supervisor import ServerEvent, Supervisor

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
    """A download's rate over its latest seconds; None until known."""
    eta_s: float | None = None
    """Seconds a download has left; None until a rate is known, 0 only at the end."""
    attempt: int | None = None
    """Which attempt of a download this is (or is next, while waiting), from 1."""
    waiting_s: float | None = None
    """Seconds until a download's next attempt, while it waits to retry."""
    retry_reason: str = ""
    """Why a download's last attempt stopped, while it waits to retry."""


@dataclass(frozen=True)
class Prepared:
    """Everything decided before the engine starts: the launch plan and what it was made on."""

    launch: LaunchPlan
    settings: config.Settings
    gpu_index: int
    ready_timeout_s: float
    peers: tuple[Peer, ...] = ()
    """The RPC peers of the launch, as they answered before it."""
    api_key: str | None = None
    """The key in the launch's key file, read once when it was made (None: no key)."""

    @property
    def server(self) -> ServerLaunch:
        return self.launch.server

    @property
    def plan(self) -> Plan:
        return self.launch.plan

    @property
    def model(self) -> str:
        """The served model's name (the preset id, or the file's stem)."""
        return self.launch.alias

    @property
    def device(self) -> str:
        return self.launch.budget.device

    @property
    def engine_version(self) -> str:
        return self.launch.engine.version

    @property
    def vram_free_bytes(self) -> int:
        return self.launch.budget.vram_free_bytes


Emit = Callable[[StepEvent], None]


def download_step(progress: TransferProgress) -> StepEvent:
    """A download's progress as the models step shows it."""
    if progress.waiting_for_pid is not None:
        message = f"waiting for pid {progress.waiting_for_pid} (fetching {progress.name})"
        return StepEvent("models", "running", message)
    return StepEvent(
        "models",
        "running",
        f"downloading {progress.name}",
        progress.fraction,
        progress.rate_bytes_per_s,
        progress.eta_s,
        progress.attempt,
        progress.waiting_s,
        progress.retry_reason,
    )


def problem_note(problem: guard.Problem) -> StepEvent:
    """A problem the model check found, as a note under the models step."""
    return StepEvent("models", "note", f"{problem.severity} {problem.code}: {problem.message}")


def _download_progress(emit: Emit) -> Callable[[TransferProgress], None]:
    return lambda progress: emit(download_step(progress))


def _build_progress(emit: Emit) -> Callable[[BuildEvent], None]:
    build_started_s: list[float] = []

    def report(event: BuildEvent) -> None:
        if event.stage == "toolkit":
            fraction = event.percent / 100 if event.percent is not None else None
            emit(StepEvent("engine", "running", f"CUDA toolkit: {event.line}", fraction))
        elif event.percent is not None:
            build_started_s[:] = build_started_s or [time.monotonic()]
            left_s = estimate_left_s(time.monotonic() - build_started_s[0], event.percent)
            emit(
                StepEvent(
                    "engine", "running", "building the engine", event.percent / 100, eta_s=left_s
                )
            )

    return report


def pull_source(paths: Paths, source: str, emit: Emit, cancel: threading.Event | None) -> Path:
    found = local_file(paths, source)
    if found is not None:
        return found
    emit(StepEvent("models", "running", f"looking for {source}"))
    return pull_model(paths, source, on_progress=_download_progress(emit), cancel=cancel).main_path


def pull_projector(
    paths: Paths,
    by_name: repoplan.RepoChoice | None,
    launch: LaunchPlan,
    emit: Emit,
    cancel: threading.Event | None,
) -> ProjectorInfo | None:
    """The projector the plan serves from the model's repo, pulled and hash-checked like the
    weights (or found in place in the HF cache, LM Studio or Ollama), where it now lies; None
    when the plan serves none of the repo's."""
    vision = launch.vision
    if by_name is None or not vision.served or vision.projector is None:
        return None
    source = by_name.projector_source(str(vision.projector.path))
    if source is None:
        return None
    return replace(vision.projector, path=pull_source(paths, source, emit, cancel))


def ensure_engine(
    paths: Paths, probe: gpu.GpuProbe, wanted: str, emit: Emit, kind: EngineKind = LLAMA_SERVER
) -> EngineManifest:
    """The installed engine of ``kind`` a launch uses, built first when there is none."""
    return _ensure_engine(paths, probe, wanted, emit, kind)[0]


def _ensure_engine(
    paths: Paths, probe: gpu.GpuProbe, wanted: str, emit: Emit, kind: EngineKind
) -> tuple[EngineManifest, bool]:
    """The engine and whether none was installed before (a plan made then must be made again)."""
    emit(StepEvent("engine", "running", f"looking for {kind.title}"))
    engine = kind.select(paths, probe, wanted).engine
    if engine is not None:
        emit(StepEvent("engine", "done", f"{engine.id} ({engine.version})"))
        return engine, False
    emit(StepEvent("engine", "note", "not built yet: building it (this takes a while once)"))
    choice = kind.choose_build(probe, toolchain.probe_cuda_toolkit())
    engine, _ = kind.build_and_install(
        paths, kind.ensure_source(paths), choice.options, on_event=_build_progress(emit)
    )
    emit(StepEvent("engine", "done", f"{engine.id} ({engine.version})"))
    return engine, True


def build_cpu_engine(paths: Paths, emit: Emit) -> EngineManifest:
    """The CPU engine a user chose after the CUDA build was refused; the pipeline then uses it."""
    emit(StepEvent("engine", "running", "building the CPU engine, as asked"))
    engine, _ = install.build_and_install(
        paths, LLAMA_SERVER.ensure_source(paths), cpu_options(), on_event=_build_progress(emit)
    )
    emit(StepEvent("engine", "done", f"{engine.id} ({engine.version})"))
    return engine


@dataclass(frozen=True)
class MachineView:
    """This machine as every plan sees it: flags over settings, GPUs, RPC peers, the budget
    over them and the installed engine. ``prepare``, ``lucebox presets`` and the TUI's preset
    table all start from it, so the table is planned on the budget the launch gets."""

    settings: config.Settings
    resolved: Resolved
    probe: gpu.GpuProbe
    peers: tuple[Peer, ...]
    budget: GpuBudget
    installed: EngineManifest | None

    @property
    def engine(self) -> EngineView:
        return EngineView.of(self.installed)


def machine_view(paths: Paths, options: ServeOptions) -> MachineView:
    """Read settings, probe the GPUs, ask the RPC peers and find the installed engine."""
    settings = config.load_settings(paths)
    if options.engine_id:
        settings = replace(settings, engine_id=options.engine_id)
    resolved = resolve(options, settings)
    probe = gpu.probe_gpus()
    found = peers.ask_peers(resolved.rpc)
    budget = budget_for(probe, resolved.gpus, options.vram_mib, peers.peer_devices(found))
    installed = registry.select_engine(paths, probe, settings.engine_id).engine
    return MachineView(settings, resolved, probe, found, budget, installed)


def prepare(
    paths: Paths,
    options: ServeOptions,
    emit: Emit,
    *,
    dry_run: bool = False,
    cancel: threading.Event | None = None,
) -> Prepared:
    """Every step before the engine starts: GPU, preset, models, engine, plan (blocking I/O).

    ``dry_run`` fetches and builds nothing: the plan uses the preset's published facts for
    files not here yet and the pinned engine's capabilities when none is built. Setting
    ``cancel`` (from another thread) stops a download between reads with
    CancelledByUserError; the partial file stays for the next run to resume.
    """
    emit(StepEvent("gpu", "running", "looking for an NVIDIA GPU"))
    view = machine_view(paths, options)
    settings, budget, installed = view.settings, view.budget, view.installed
    emit(
        StepEvent("gpu", "done", f"{budget.device}, {units.gib_text(budget.vram_free_bytes)} free")
    )
    preset = None
    if options.model:
        emit(StepEvent("preset", "done", f"no preset: serving {options.model}"))
    else:
        emit(StepEvent("preset", "running", "choosing the model set"))
        preset = presetchoice.pick_preset(paths, options, view.resolved, budget, view.engine)
        emit(StepEvent("preset", "done", f"{preset.id} ({preset.title})"))
    by_name = repoplan.by_name(
        paths, options, resolved=view.resolved, budget=budget, engine=view.engine
    )
    if by_name is not None:
        emit(StepEvent("models", "note", by_name.why))
        options = replace(options, model=by_name.source, quant=None)
    if not dry_run:
        target_source = options.model or (preset.target.source if preset else "")
        pull_source(paths, target_source, emit, cancel)
        draft_source = options.draft or (
            preset.draft.model.source if preset and preset.draft and preset.draft.model else None
        )
        if draft_source:
            pull_source(paths, draft_source, emit, cancel)
        if options.prefill not in (None, "off"):  # PFlash scores the prompt with its drafter
            pull_source(paths, PREFILL_DRAFTER_SOURCE, emit, cancel)

    def plan_with(
        installed: EngineManifest | None,
        projectors: tuple[ProjectorInfo, ...] = by_name.projector_infos if by_name else (),
    ) -> LaunchPlan:
        return planner.plan_launch(
            paths,
            options,
            resolved=view.resolved,
            budget=budget,
            engine=EngineView.of(installed),
            preset=preset,
            remote_facts=by_name.facts if by_name else None,
            projectors=projectors,
        )

    # One plan from the engines installed now, made again only when the engine it routes to
    # was built just now: the plan then reads what the new binary can do.
    launch = plan_with(installed)
    if not dry_run:
        kind = kinds.kind(launch.engine_kind)
        if _ensure_engine(paths, view.probe, settings.engine_id, emit, kind)[1]:
            installed = LLAMA_SERVER.select(paths, view.probe, settings.engine_id).engine
            launch = plan_with(installed)
        pulled = pull_projector(paths, by_name, launch, emit, cancel)
        if pulled is not None:
            launch = plan_with(installed, (pulled,))
        paths.ensure(paths.slots_dir)  # the engine refuses a save path that is missing
    peers.check_builds(view.peers, EngineView.of(installed).version)
    emit(StepEvent("plan", "running", "sizing context, KV cache and speculation"))
    if by_name is not None:
        launch = replace(
            launch, source_choice=repoplan.with_vision(by_name.document, launch.vision)
        )
    for problem in launch.problems:
        emit(problem_note(problem))
    if launch.refusal is not None:
        raise PlanRefusal(launch, launch.refusal)
    emit(
        StepEvent(
            "models",
            "done",
            launch.target.path.name + (" + draft" if launch.speculation.draft else ""),
        )
    )
    emit(StepEvent("plan", "done", plan_summary(launch)))
    api_key = None
    if not dry_run and launch.server.api_key_file:
        key_path, api_key, created = ensure_api_key_file(paths, settings.api_key)
        if created:
            emit(
                StepEvent("server", "note", f"API key (shown once, kept in {key_path}): {api_key}")
            )
    # Loading reads the whole file: allow a minute per GiB on top of two minutes.
    size_bytes = launch.target.path.stat().st_size if launch.target.present else 0
    ready_timeout_s = 120 + 60 * size_bytes / 2**30
    gpu_index = launch.server.gpus[0] if launch.server.gpus else 0
    return Prepared(launch, settings, gpu_index, ready_timeout_s, view.peers, api_key)


def plan_summary(launch: LaunchPlan) -> str:
    plan = launch.plan
    spec = launch.speculation.spec_type or "no speculation"
    return (
        f"ctx {plan.ctx}, KV {plan.cache_type_k}, {spec}, "
        f"{units.gib_text(plan.memory_bytes.total, 2)} of "
        f"{units.gib_text(launch.budget.vram_free_bytes)}"
    )


class Replanner:
    """The launch being served, and the one planner's answer when it must change: a smaller
    context after running out of memory, shorter drafts or none when speculation does not pay.
    """

    def __init__(self, paths: Paths, prepared: Prepared) -> None:
        self.paths = paths
        self.settings = prepared.settings
        self.prepared = prepared
        self.current = prepared.launch
        self.calibrator: calibrator.Calibrator | None = None
        """The calibration of this launch, which keeps the store's entry while it runs."""
        self._llama_engine: EngineView | None = None

    def after_oom(self, server: ServerLaunch) -> ServerLaunch | None:
        """A context the user asked for is never shrunk: the re-plan refuses (exit 3)."""
        smaller = planner.smaller_context_plan(self.paths, self.current, self.settings)
        if smaller.refusal is not None:
            return None
        self.current = smaller
        return smaller.server

    def after_spec_decision(self, decision: Decision, server: ServerLaunch) -> ServerLaunch | None:
        """The launch with shorter drafts, or without speculation; None keeps the one running
        (a re-plan of the same files on the same card that no longer fits cannot start). A
        switch-off is written to the measurement store, so a restart keeps it off."""
        if decision.action == "off":
            self._keep_off(server, decision.reason)
        if decision.action == "shorten":
            changed = planner.replan(
                self.paths, self.current, self.settings, draft_max=decision.draft_max
            )
        else:
            changed = planner.replan(self.paths, self.current, self.settings, spec="off")
        if changed.refusal is not None:
            return None
        self.current = changed
        return changed.server

    def _keep_off(self, server: ServerLaunch, why: str) -> None:
        label = calibrator.running_label(server)
        if self.calibrator is not None:
            self.calibrator.keep_guard_off(label, why)
            return
        key = self.current.speculation.measurement_key
        if key is None:
            return
        try:
            found = measurements.read_measurement(self.paths, key) or Measurement(key)
            measurements.write_measurement(self.paths, found.with_guard_off(label, why))
        except (OSError, LuceboxError):
            return  # the switch-off still holds for this run; a restart measures again

    def for_trial(self, trial: Trial) -> ServerLaunch | None:
        """The served launch re-planned with one calibration configuration (None: it cannot
        start here)."""
        changed = planner.replan(
            self.paths,
            self.prepared.launch,
            self.settings,
            spec=trial.mode,
            draft_max=trial.draft_max,
            p_min=trial.p_min,
        )
        if changed.refusal is not None:
            return None
        return changed.server

    def for_engine(self, kind: KindName | None) -> tuple[ServerLaunch, str] | None:
        """The launch re-planned on ``kind`` (None: the planner's choice, which reads the
        engines' verdict), with its speculation reason; None when it cannot start here."""
        first = self.prepared.launch
        if self._llama_engine is None:
            if first.engine_kind == "llama-server":
                self._llama_engine = first.engine
            else:
                found = registry.select_engine(
                    self.paths, gpu.probe_gpus(), self.settings.engine_id
                )
                self._llama_engine = EngineView.of(found.engine)
        changed = planner.replan(
            self.paths,
            first,
            self.settings,
            engine_kind=kind,
            llama_engine=self._llama_engine,
        )
        if changed.refusal is not None or self._lossy(changed):
            return None
        self.current = changed
        return changed.server, changed.speculation.reason

    def _lossy(self, changed: LaunchPlan) -> bool:
        """A launch that would serve the context with KVFlash (not exact) though the user
        neither pinned it nor forced that engine: never a candidate for being faster."""
        resolved = self.prepared.launch.resolved
        pooled = changed.plan.kvflash_pool_tokens is not None
        chosen_by_user = (
            resolved.kv_mode == "kvflash" or resolved.engine_mode == changed.engine_kind
        )
        return pooled and not chosen_by_user

    def measured(self) -> tuple[ServerLaunch, str] | None:
        """The launch planned again once the calibration stored its rates."""
        changed = planner.replan(self.paths, self.prepared.launch, self.settings)
        if changed.refusal is not None:
            return None
        self.current = changed
        return changed.server, changed.speculation.reason


def new_supervisor(paths: Paths, prepared: Prepared) -> Supervisor:
    """The supervisor of the prepared launch, knowing the engine build it runs (its CPU
    baseline, and how to rebuild it for a lower one) and the model's name in the store."""
    supervisor = Supervisor(
        prepared.server, engine_log(paths), ready_timeout_s=prepared.ready_timeout_s
    )
    engine = served_engine(paths, prepared.server)
    supervisor.cpu_target = engine.cpu_target if engine is not None else None
    if engine is not None and engine.origin == "build":
        supervisor.rebuild_for_cpu = functools.partial(rebuild_for_cpu, paths)
    supervisor.model_name = stored_name(paths, prepared.server.model_path)
    if engine is not None and update.count_start(paths, engine.id) is not None:
        supervisor.after_give_up = functools.partial(_roll_back_after_give_up, paths, engine.id)
    return supervisor


def _roll_back_after_give_up(paths: Paths, engine_id: str, death: EngineDeath) -> str | None:
    return update.roll_back_after_give_up(paths, engine_id, death.code)


def served_engine(paths: Paths, server: ServerLaunch) -> EngineManifest | None:
    """The installed engine whose server the launch runs; None when it is not one of them."""
    found = (e for e in registry.list_engines(paths) if e.server_path == server.server_path)
    return next(found, None)


def stored_name(paths: Paths, model_path: str) -> str | None:
    """The name of the stored model whose file ``model_path`` is; None for a file the store
    does not hold."""
    for record in list_models(paths):
        if any(f.path == model_path for f in record.files):
            return record.name
    return None


def rebuild_for_cpu(
    paths: Paths, server: ServerLaunch, cpu_target: str, cancel: threading.Event
) -> ServerLaunch:
    """The launch on the served engine's version built again for the CPU baseline
    ``cpu_target``, after it died of an illegal instruction; stops when ``cancel`` is set."""
    engine = served_engine(paths, server)
    if engine is None:
        raise LuceboxError(f"{server.server_path} is not an engine lucebox installed")
    registry.mark_died_of_illegal_instruction(paths, engine.id)
    kind = kinds.kind(engine.kind)
    source = kind.ensure_source(paths)
    if source.identity != engine.source_identity:
        raise LuceboxError(
            f"the source {engine.id} was built from is not here ({source.identity} is)",
            hint=f"`{kind.build_command}` builds the pinned engine for this CPU",
        )

    def on_event(event: BuildEvent) -> None:
        if cancel.is_set():
            raise CancelledByUserError(f"the rebuild of {engine.id} for {cpu_target} was stopped")

    rebuilt, _ = kind.build_and_install(
        paths, source, engine.build_options(cpu_target), on_event=on_event
    )
    return replace(server, server_path=rebuilt.server_path)


def server_run(paths: Paths, prepared: Prepared, supervisor: Supervisor) -> ServerRun:
    """The run that supervises ``supervisor``'s engine, samples it and keeps the state file;
    every change of launch while it runs comes from the one planner (``Replanner``)."""
    server = prepared.server
    launch = prepared.launch
    replanner = Replanner(paths, prepared)
    supervisor.replan_on_oom = replanner.after_oom
    setup = calibrator.setup_for(launch, prepared.settings, replanner.for_trial, replanner.measured)
    measuring = calibrator.Calibrator(paths, setup) if setup is not None else None
    replanner.calibrator = measuring
    engines = _engine_calibrator(paths, prepared, replanner, measuring)
    guard = None
    if measuring is not None:
        guard = measuring.guard_for(server, shortened=launch.options.draft_max is not None)
    elif server.spec_type is not None:
        guard = SpecGuard.for_launch(
            server.spec_type,
            server.draft_max,
            launch.budget.is_gpu,
            shortened=launch.options.draft_max is not None,
        )
    return ServerRun(
        paths,
        supervisor,
        model=prepared.model,
        gpu_index=prepared.gpu_index,
        spec_reason=launch.speculation.reason,
        webui_url=webui.served_url(server.server_path, server.host, server.port),
        spec_guard=guard,
        spec_asked=launch.resolved.spec != "auto",
        on_spec_decision=replanner.after_spec_decision,
        api_key=prepared.api_key,
        peers=tuple(
            PeerStatus(p.address, p.info.build, p.info.free_bytes, "up") for p in prepared.peers
        ),
        calibrator=measuring,
        engine_calibrator=engines,
        thinking_default=chatdefaults.thinking_default(launch.target.facts.architecture),
    )


def _engine_calibrator(
    paths: Paths,
    prepared: Prepared,
    replanner: Replanner,
    measuring: calibrator.Calibrator | None,
) -> EngineCalibrator | None:
    """The engine calibration of a launch both engines can serve, once both are built."""
    launch, settings = prepared.launch, prepared.settings
    choice = launch.engine_choice
    if choice is None or choice.key is None or choice.missing_build is not None:
        return None
    if settings.calibrate_idle_s <= 0:
        return None
    mode = launch.resolved.engine_mode
    on_gpu = launch.budget.is_gpu

    def guard_for(server: ServerLaunch) -> SpecGuard | None:
        if measuring is not None and server.kind == "llama-server":
            return measuring.guard_for(server)
        if server.spec_type is None or server.kind != "llama-server":
            return None
        return SpecGuard.for_launch(server.spec_type, server.draft_max, on_gpu)

    return EngineCalibrator(
        paths,
        EngineSetup(
            choice.key,
            None if mode == "auto" else mode,
            settings.calibrate_idle_s,
            settings.probe_max_tokens or None,
            replanner.for_engine,
            guard_for,
            before=lambda: measuring is None or measuring.state == "done",
        ),
    )


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
    server = prepared.server
    webui_url = webui.served_url(server.server_path, server.host, server.port)
    async for item in run.events():
        if isinstance(item, ServerEvent):
            state: StepState = "failed" if item.kind == "gave-up" else "running"
            emit(StepEvent("server", state, f"{item.kind}: {item.message}"))
            if item.kind == "ready" and webui_url:
                emit(StepEvent("server", "note", f"chat in a browser: {webui_url}"))
            if item.kind == "gave-up":
                exit_code = 1
    return exit_code
