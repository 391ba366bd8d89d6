"""The headless pipeline of `lucebox serve` (and `up --headless`): from GPU to a served model.

probe GPU -> choose preset -> models (pull + guards) -> engine (build if missing) -> plan ->
launch -> supervise + sample. The prepared launch's run (its supervisor, calibrations and
re-plans) is made in :mod:`lucebox.engine.runstart`; the lock, the state file and the running
server's stop and restart are in :mod:`lucebox.engine.run.runstate`.

``prepare`` reads as the checklist's steps in order, emitting each, so the CLI's lines and the
TUI's checklist follow it one to one; the longer steps are functions of their own below it.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from lucebox.engine.core import units
from lucebox.engine.core.downloadprogress import TransferProgress
from lucebox.engine.core.errors import FetchError, GuardRefusal
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import kinds, toolchain, webui
from lucebox.engine.engines.build import BuildEvent, cpu_options, estimate_left_s
from lucebox.engine.engines.kinds import LLAMA_SERVER, EngineKind
from lucebox.engine.engines.registry import EngineManifest
from lucebox.engine.machine import config, gpu, peers
from lucebox.engine.machine.apikey import ensure_api_key_file
from lucebox.engine.machine.budget import GpuBudget, budget_for
from lucebox.engine.machine.peers import Peer
from lucebox.engine.models import checkresult
from lucebox.engine.models.modelsource import parse_source
from lucebox.engine.models.presets import Preset
from lucebox.engine.models.projector import ProjectorInfo, read_projector
from lucebox.engine.models.pull import pull_model
from lucebox.engine.models.records import stored_file
from lucebox.engine.plan import modelfiles, planner
from lucebox.engine.plan.engineview import EngineView, Installs
from lucebox.engine.plan.launchplan import LaunchPlan, PlanRefusal
from lucebox.engine.plan.lucebox.luceboxplan import PREFILL_DRAFTER_SOURCE
from lucebox.engine.plan.options import Resolved, resolve
from lucebox.engine.plan.options import ServeOptions as ServeOptions
from lucebox.engine.plan.sources import presetchoice, repoplan
from lucebox.engine.run.runstate import ServeLock
from lucebox.engine.run.supervision.serverevent import ServerEvent
from lucebox.engine.runstart import Prepared as Prepared
from lucebox.engine.runstart import new_supervisor, server_run

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


def problem_note(problem: checkresult.Problem) -> StepEvent:
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
    """The file of ``source`` on disk, pulled into the store first when it is not."""
    parsed = parse_source(source)
    found = stored_file(paths, parsed)
    if found is not None:
        return found
    emit(StepEvent("models", "running", f"looking for {source}"))
    return pull_model(paths, parsed, on_progress=_download_progress(emit), cancel=cancel).main_path


def pull_projector(
    paths: Paths,
    source_of: Callable[[str], str | None],
    launch: LaunchPlan,
    resolved: Resolved,
    emit: Emit,
    cancel: threading.Event | None,
) -> tuple[tuple[ProjectorInfo, ...], str] | None:
    """The projector the plan serves, pulled and hash-checked like the weights (or found in
    place in the HF cache, LM Studio or Ollama): the projectors to plan again with, and why
    vision is left out ("" when it is not); None when the plan serves none that ``source_of``
    (planned path -> source: the model's repo or its preset) names. A preset's projector
    planned from its preset is read from disk once pulled; one that cannot be pulled leaves
    vision out with the reason, or refuses with --vision on."""
    projector = launch.vision.projector
    if not launch.vision.served or projector is None:
        return None
    source = source_of(str(projector.path))
    if source is None:
        return None
    if not projector.stand_in:
        return (replace(projector, path=pull_source(paths, source, emit, cancel)),), ""
    try:
        path = pull_source(paths, source, emit, cancel)
    except FetchError as exc:
        missing = f"the projector {projector.path.name} is not on disk and could not be pulled"
        if resolved.vision == "on":
            raise GuardRefusal(
                f"vision is on ({resolved.vision_from}) but {missing}: {exc.message}",
                hint=f"run `lucebox models pull {source}` where the Hub can be reached, "
                "or pass --vision auto to serve text only",
            ) from exc
        pull = f"run `lucebox models pull {source}` once the Hub can be reached"
        return (), f"not served: {missing} ({exc.message}); {pull}"
    found = read_projector(path)
    if found is None:
        raise GuardRefusal(
            f"{path.name}, pulled as the preset's projector ({source}), is not a vision projector",
            hint="pass --mmproj PATH (the model's mmproj GGUF), or --vision off",
        )
    return (found,), ""


def projector_candidates(
    paths: Paths,
    preset: Preset | None,
    by_name: repoplan.RepoChoice | None,
    resolved: Resolved,
) -> tuple[tuple[ProjectorInfo, ...], Callable[[str], str | None], str]:
    """The projectors the plan weighs (the model's repo's, or the one its preset names), the
    source each is pulled from, and why the preset's was not weighed ("" when it was). A file
    here that is not a projector refuses --vision on."""
    if by_name is not None:
        return by_name.projector_infos, by_name.projector_source, ""
    chosen = modelfiles.preset_vision(paths, preset, resolved)
    if chosen.refusal is not None:
        raise chosen.refusal
    return chosen.projectors, chosen.source_of, chosen.unplanned


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
    engine, _ = LLAMA_SERVER.build_and_install(
        paths, LLAMA_SERVER.ensure_source(paths), cpu_options(), on_event=_build_progress(emit)
    )
    emit(StepEvent("engine", "done", f"{engine.id} ({engine.version})"))
    return engine


@dataclass(frozen=True)
class MachineView:
    """This machine as every plan sees it: flags over settings, GPUs, RPC peers, the budget
    over them and every engine kind's installed build. ``prepare``, ``lucebox presets`` and
    the TUI's preset table all start from it, so the table is planned on the budget the
    launch gets."""

    settings: config.Settings
    resolved: Resolved
    probe: gpu.GpuProbe
    peers: tuple[Peer, ...]
    budget: GpuBudget
    installs: Installs

    @property
    def engine(self) -> EngineView:
        """llama-server's build (its version is the one RPC peers must match)."""
        return self.installs.llama_server


def machine_view(paths: Paths, options: ServeOptions) -> MachineView:
    """Read settings, probe the GPUs, ask the RPC peers and find each engine kind's build."""
    settings = config.load_settings(paths)
    if options.engine_id:
        settings = replace(settings, engine_id=options.engine_id)
    resolved = resolve(options, settings)
    probe = gpu.probe_gpus()
    found = peers.ask_peers(resolved.rpc)
    budget = budget_for(probe, resolved.gpus, options.vram_mib, peers.peer_devices(found))
    installs = planner.find_installs(paths, probe, settings.engine_id)
    return MachineView(settings, resolved, probe, found, budget, installs)


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
    budget = view.budget
    emit(
        StepEvent("gpu", "done", f"{budget.device}, {units.gib_text(budget.vram_free_bytes)} free")
    )
    preset = _preset_step(paths, options, view, emit)
    by_name = repoplan.by_name(
        paths, options, resolved=view.resolved, budget=budget, installs=view.installs
    )
    if by_name is not None:
        emit(StepEvent("models", "note", by_name.why))
        options = replace(options, model=by_name.source, quant=None)
    if not dry_run:
        _pull_models(paths, options, preset, emit, cancel)
        for _role, source in view.resolved.side_models:
            pull_source(paths, source, emit, cancel)
        # Here and checked: the step says so while the engine builds (minutes, on a first run).
        emit(StepEvent("models", "done", "the model files are here"))
    launch = _launch_plan(
        paths, options, view, preset, by_name, emit, dry_run=dry_run, cancel=cancel
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
        api_key = server_api_key(paths, view.settings, emit)
    # Loading reads the whole file: allow a minute per GiB on top of two minutes.
    size_bytes = launch.target.path.stat().st_size if launch.target.present else 0
    ready_timeout_s = 120 + 60 * size_bytes / 2**30
    gpu_index = launch.server.gpus[0] if launch.server.gpus else 0
    return Prepared(launch, view.settings, gpu_index, ready_timeout_s, view.peers, api_key)


def _preset_step(
    paths: Paths, options: ServeOptions, view: MachineView, emit: Emit
) -> Preset | None:
    """The preset served, picked for this machine; None when a model is named."""
    if options.model:
        emit(StepEvent("preset", "done", f"no preset: serving {options.model}"))
        return None
    emit(StepEvent("preset", "running", "choosing the model set"))
    preset = presetchoice.pick_preset(paths, options, view.resolved, view.budget, view.installs)
    emit(StepEvent("preset", "done", f"{preset.id} ({preset.title})"))
    return preset


def _pull_models(
    paths: Paths,
    options: ServeOptions,
    preset: Preset | None,
    emit: Emit,
    cancel: threading.Event | None,
) -> None:
    """The target, its draft and PFlash's drafter, pulled when they are not here."""
    target_source = options.model or (preset.target.source if preset else "")
    pull_source(paths, target_source, emit, cancel)
    draft_source = options.draft or (
        preset.draft.model.source if preset and preset.draft and preset.draft.model else None
    )
    if draft_source:
        pull_source(paths, draft_source, emit, cancel)
    if options.prefill not in (None, "off"):  # PFlash scores the prompt with its drafter
        pull_source(paths, PREFILL_DRAFTER_SOURCE, emit, cancel)


def _launch_plan(
    paths: Paths,
    options: ServeOptions,
    view: MachineView,
    preset: Preset | None,
    by_name: repoplan.RepoChoice | None,
    emit: Emit,
    *,
    dry_run: bool,
    cancel: threading.Event | None,
) -> LaunchPlan:
    """The launch planned, its engine built and its projector pulled (unless ``dry_run``)."""
    candidates, source_of, unplanned = projector_candidates(paths, preset, by_name, view.resolved)

    def plan_with(
        installs: Installs, projectors: tuple[ProjectorInfo, ...] = candidates
    ) -> LaunchPlan:
        return planner.plan_launch(
            paths,
            options,
            resolved=view.resolved,
            budget=view.budget,
            installs=installs,
            preset=preset,
            remote_facts=by_name.facts if by_name else None,
            projectors=projectors,
        )

    # One plan from the engines installed now, made again only when the engine it routes to
    # was built just now: the plan then reads what the new binary can do.
    installs = view.installs
    launch = plan_with(installs)
    if not dry_run:
        kind = kinds.kind(launch.engine_kind)
        engine_id = view.settings.engine_id
        built = _ensure_engine(paths, view.probe, engine_id, emit, kind)[1]
        if launch.sides.models and kind is not LLAMA_SERVER:  # side models run on llama-server
            built = _ensure_engine(paths, view.probe, engine_id, emit, LLAMA_SERVER)[1] or built
        if built:
            installs = planner.find_installs(paths, view.probe, engine_id)
            launch = plan_with(installs)
        pulled = pull_projector(paths, source_of, launch, view.resolved, emit, cancel)
        if pulled is not None:
            launch = plan_with(installs, pulled[0])
            unplanned = unplanned or pulled[1]
        paths.ensure(paths.slots_dir)  # the engine refuses a save path that is missing
    peers.check_builds(view.peers, installs.llama_server.version)
    emit(StepEvent("plan", "running", "sizing context, KV cache and speculation"))
    if by_name is not None:
        launch = replace(
            launch, source_choice=repoplan.with_vision(by_name.document, launch.vision)
        )
    if unplanned and not launch.vision.served:
        emit(StepEvent("models", "note", f"vision {unplanned}"))
        launch = launch.with_vision_left_out(unplanned)
    if launch.users is not None and launch.users.note:
        emit(StepEvent("plan", "note", launch.users.note))
    return launch


def server_api_key(paths: Paths, settings: config.Settings, emit: Emit) -> str:
    """The key the server checks, from its key file; a key generated now is shown once."""
    key_path, api_key, created = ensure_api_key_file(paths, settings.api_key)
    if created:
        emit(StepEvent("server", "note", f"API key (shown once, kept in {key_path}): {api_key}"))
    return api_key


def plan_summary(launch: LaunchPlan) -> str:
    plan = launch.plan
    spec = launch.speculation.spec_type or "no speculation"
    return (
        f"ctx {plan.ctx}, KV {plan.cache_type_k}, {spec}, "
        f"{units.gib_text(plan.memory_bytes.total, 2)} of "
        f"{units.gib_text(launch.budget.vram_free_bytes)}"
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
