"""From a prepared launch to a supervised run: the supervisor (knowing the engine build it
runs and how to rebuild it for this CPU), the run with its calibrations, and the
:class:`Replanner` through which every change of launch while it runs comes from the one
planner. `serve`, the TUI and the served set start their runs here."""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lucebox.engine.core.errors import CancelledByUserError, LuceboxError
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import kinds, registry, uibundle, update, webui
from lucebox.engine.engines.build import BuildEvent
from lucebox.engine.engines.registry import EngineManifest, KindName
from lucebox.engine.machine import config
from lucebox.engine.machine.peers import Peer
from lucebox.engine.models.records import list_models
from lucebox.engine.plan import chatdefaults, planner
from lucebox.engine.plan.launch import ServerLaunch
from lucebox.engine.plan.launchplan import LaunchPlan
from lucebox.engine.plan.lucebox.kvmodes import KvTrial
from lucebox.engine.plan.memory.memory import Plan
from lucebox.engine.plan.speculation import measurements
from lucebox.engine.plan.speculation.measurements import Measurement
from lucebox.engine.plan.speculation.specguard import Decision, SpecGuard
from lucebox.engine.run.calibrate import calibrator
from lucebox.engine.run.calibrate.calibration import Trial
from lucebox.engine.run.calibrate.enginecalibrator import EngineCalibrator, EngineSetup
from lucebox.engine.run.calibrate.kvcalibrator import KvModeCalibrator, KvSetup
from lucebox.engine.run.calibrate.probing import MeasuredRun, ProbePace, served_sampling
from lucebox.engine.run.death import EngineDeath
from lucebox.engine.run.front.chatpage import ChatPage
from lucebox.engine.run.hang import bounds_for
from lucebox.engine.run.kinds.enginerun import engine_run
from lucebox.engine.run.runsetup import Calibrations, RunFacts, SpecSetup
from lucebox.engine.run.runstate import engine_log
from lucebox.engine.run.sample import EngineStatus, PeerStatus
from lucebox.engine.run.serverrun.serverrun import ServerRun
from lucebox.engine.run.supervisor import Supervisor


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


def keep_guard_off(paths: Paths, launch: LaunchPlan, label: str, why: str) -> None:
    """Write the guard's switch-off of ``label`` to the measurement store under ``launch``'s
    key, so a restart plans it off."""
    key = launch.speculation.measurement_key
    if key is None:
        return
    try:
        found = measurements.read_measurement(paths, key) or Measurement(key)
        measurements.write_measurement(paths, found.with_guard_off(label, why))
    except (OSError, LuceboxError):
        return  # the switch-off still holds for this run; a restart measures again


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
        self.run: MeasuredRun | None = None
        """The run serving the launch, whose front records the sampling clients get."""

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
            changed = self._replan(self.current, draft_max=decision.draft_max)
        else:
            changed = self._replan(self.current, spec="off")
        if changed.refusal is not None:
            return None
        self.current = changed
        return changed.server

    def _keep_off(self, server: ServerLaunch, why: str) -> None:
        label = calibrator.running_label(server)
        if self.calibrator is not None:
            self.calibrator.keep_guard_off(label, why)
            return
        keep_guard_off(self.paths, self.current, label, why)

    def for_trial(self, trial: Trial) -> ServerLaunch | None:
        """The served launch re-planned with one calibration configuration (None: it cannot
        start here)."""
        changed = self._replan(
            self.prepared.launch,
            spec=trial.mode,
            spec_type=trial.spec_type,
            draft_max=trial.draft_max,
            p_min=trial.p_min,
        )
        if changed.refusal is not None:
            return None
        return changed.server

    def for_engine(self, kind: KindName | None) -> tuple[ServerLaunch, str] | None:
        """The launch re-planned on ``kind`` (None: the planner's choice, which reads the
        engines' verdict), with its speculation reason; None when it cannot start here."""
        changed = self._replan(self.prepared.launch, engine_kind=kind)
        if changed.refusal is not None or self._lossy(changed):
            return None
        self.current = changed
        return changed.server, changed.speculation.reason

    def for_kv_trial(self, trial: KvTrial) -> ServerLaunch | str:
        """The served launch re-planned with one long-context mode at the served context (a
        smaller one after an out-of-memory re-plan), or why that mode cannot serve here."""
        served = self.current
        kv = (trial.kv_mode, trial.kv_type, served.plan.ctx)
        changed = self._replan(served, kv=kv)
        if changed.refusal is not None:
            return str(changed.refusal)
        return changed.server

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
        changed = self._replan(self.prepared.launch)
        if changed.refusal is not None:
            return None
        self.current = changed
        return changed.server, changed.speculation.reason

    def _replan(self, launch: LaunchPlan, **changes: Any) -> LaunchPlan:
        """``launch`` planned again with ``changes``, always at the sampling the calibration
        measures: a re-plan read at the model's defaults instead would miss every verdict
        stored for the clients' sampling (the engine's, the speculation's, the KV mode's)."""
        return planner.replan(
            self.paths, launch, self.settings, measured_at=self._measured_at(), **changes
        )

    def _measured_at(self) -> str | None:
        """The sampling the calibrations measure the served mix at, which the planner reads
        the verdicts of: the front's (its defaults before any traffic), else the speculation
        calibration's key's; None before either."""
        served = served_sampling(self.run) if self.run is not None else None
        if served is not None:
            return served[1]
        measuring = self.calibrator
        return measuring.setup.key.sampling if measuring is not None else None


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
    page = chat_page(paths, server)
    replanner = Replanner(paths, prepared)
    supervisor.replan_on_oom = replanner.after_oom
    setup = calibrator.setup_for(launch, prepared.settings, replanner.for_trial, replanner.measured)
    measuring = calibrator.Calibrator(paths, setup) if setup is not None else None
    replanner.calibrator = measuring
    engines = _engine_calibrator(paths, prepared, replanner, measuring)
    long_context = _kv_calibrator(paths, prepared, replanner, (measuring, engines))
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
    run = ServerRun(
        paths,
        supervisor,
        RunFacts(
            model=prepared.model,
            gpu_index=prepared.gpu_index,
            api_key=prepared.api_key,
            webui_url=page.url(server),
            peers=tuple(
                PeerStatus(p.address, p.info.build, p.info.free_bytes, "up") for p in prepared.peers
            ),
            thinking_default=chatdefaults.thinking_default(launch.target.facts.architecture),
            sampling=launch.sampling,
            planned_engine=planned_engine(launch),
            hang_bounds=bounds_for(prepared.settings.hang_s),
            allowed_origins=prepared.settings.allowed_origins,
            mdns_name=prepared.settings.mdns_name,
            sleep_idle_s=prepared.settings.sleep_idle_s,
            sides=launch.sides.models,
            chat_page=page.front_page,
            no_page_reason=page.why_none,
        ),
        SpecSetup(
            launch.speculation.reason,
            guard,
            asked=launch.resolved.spec != "auto",
            on_decision=replanner.after_spec_decision,
        ),
        Calibrations(measuring, engines, long_context),
    )
    replanner.run = run
    return run


@dataclass(frozen=True)
class PageChoice:
    """Who serves the chat page: the engine (it embeds the UI), the front, or nobody."""

    served: bool
    front_page: ChatPage | None = None
    why_none: str = ""

    def url(self, server: ServerLaunch) -> str | None:
        """Where a browser finds the page of ``server``; None without one."""
        return webui.webui_url(server.host, server.port) if self.served else None


def chat_page(paths: Paths, server: ServerLaunch) -> PageChoice:
    """The engine's own page where it has one; else the front serves the llama.cpp build's."""
    if webui.has_webui(Path(server.server_path)):
        return PageChoice(served=True)
    bundle = uibundle.find_bundle(paths)
    if bundle.folder is None:
        return PageChoice(served=False, why_none=bundle.why_none)
    answers = engine_run(server.kind).answers_chat_page
    return PageChoice(served=True, front_page=ChatPage(bundle.folder, answers_api=not answers))


def planned_engine(launch: LaunchPlan) -> EngineStatus:
    """The engine kind ``launch`` serves on and what chose it, as `status` shows it."""
    choice = launch.engine_choice
    if choice is None:
        return EngineStatus(launch.engine_kind, "rule", "")
    asked = launch.resolved.engine_mode != "auto" or launch.resolved.kv_mode == "kvflash"
    chosen_by = "measured" if choice.measured else "asked" if asked else "rule"
    return EngineStatus(choice.kind, chosen_by, choice.reason)


def _kv_calibrator(
    paths: Paths,
    prepared: Prepared,
    replanner: Replanner,
    first: tuple[calibrator.Calibrator | None, EngineCalibrator | None],
) -> KvModeCalibrator | None:
    """The long-context mode measurement of a Lucebox launch whose context is long; it starts
    once the speculation and engine calibrations are done, and only while the Lucebox engine
    serves (KVFlash is its own)."""
    modes = prepared.launch.kv_modes
    settings = prepared.settings
    if modes is None or settings.calibrate_idle_s <= 0:
        return None

    def has_modes() -> bool:
        return kinds.kind(replanner.current.engine_kind).serves_kv_modes

    def before() -> bool:
        return has_modes() and all(c is None or c.state == "done" for c in first)

    def serving_plan() -> ServerLaunch | None:
        return replanner.current.server if has_modes() else None

    return KvModeCalibrator(
        paths,
        KvSetup(
            modes,
            ProbePace(settings.calibrate_idle_s, settings.probe_max_tokens or None, before),
            replanner.for_kv_trial,
            serving_plan,
        ),
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
        if server.spec_type is None or not kinds.kind(server.kind).calibrates_speculation:
            return None
        if measuring is not None:
            return measuring.guard_for(server)
        return SpecGuard.for_launch(server.spec_type, server.draft_max, on_gpu)

    return EngineCalibrator(
        paths,
        EngineSetup(
            choice.key,
            None if mode == "auto" else mode,
            ProbePace(
                settings.calibrate_idle_s,
                settings.probe_max_tokens or None,
                lambda: measuring is None or measuring.state == "done",
            ),
            replanner.for_engine,
            guard_for,
        ),
    )
