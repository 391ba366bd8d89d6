"""The headless pipeline of `lucebox serve` (and `up --headless`): from GPU to a served model.

probe GPU -> choose preset -> models (pull + guards) -> engine (build if missing) -> plan ->
launch -> supervise + sample. One server per user: a lock in the runtime dir, and a state
file there that `lucebox status` and `lucebox down` read.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

from lucebox.engine import (
    config,
    gpu,
    guard,
    peers,
    planning,
    registry,
    store,
    toolchain,
    units,
    webui,
)
from lucebox.engine.apikey import ensure_api_key_file
from lucebox.engine.atomic import write_text_atomic
from lucebox.engine.build import BuildEvent, choose_options
from lucebox.engine.errors import LuceboxError
from lucebox.engine.launch import LaunchSpec, url_of
from lucebox.engine.metrics import Sample, Sampler, with_last_rates
from lucebox.engine.paths import Paths
from lucebox.engine.plan import Plan
from lucebox.engine.planning import LaunchPlan
from lucebox.engine.planning import ServeOptions as ServeOptions
from lucebox.engine.registry import EngineManifest
from lucebox.engine.source import ensure_source
from lucebox.engine.supervisor import ServerEvent, Supervisor
from lucebox.engine.transfer import TransferProgress

STATE_NAME = "serve.json"
LOCK_NAME = "serve.lock"


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
    """Everything decided before the engine starts: the launch plan and what it was made on."""

    launch: LaunchPlan
    settings: config.Settings
    gpu_index: int
    ready_timeout_s: float

    @property
    def spec(self) -> LaunchSpec:
        return self.launch.spec

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


class AlreadyServingError(LuceboxError):
    """Another lucebox server runs for this user."""


def state_file(paths: Paths) -> Path:
    return paths.runtime_dir / STATE_NAME


def engine_log(paths: Paths) -> Path:
    return paths.logs_dir / "engine.log"


def read_state(paths: Paths) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(state_file(paths).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return state


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def current_status(paths: Paths) -> dict[str, Any]:
    """The DESIGN.md status shape; "stopped" when no lucebox server is alive."""
    state = read_state(paths)
    if state is None or not _pid_alive(state.get("pid")):
        return {
            "state": "stopped",
            "pid": None,
            "url": None,
            "model": None,
            "uptime_s": 0,
            "restarts": 0,
            "sample": None,
            "webui_url": None,
        }
    return {
        "state": state["state"],
        "pid": state["pid"],
        "url": state["url"],
        "model": state["model"],
        "uptime_s": round(time.time() - state["started_at"], 1),
        "restarts": state["restarts"],
        "sample": state.get("sample"),
        "engine_pid": state.get("engine_pid"),
        "log": state.get("log"),
        "webui_url": state.get("webui_url"),
    }


def start_detached(paths: Paths, options: ServeOptions) -> tuple[int, Path]:
    """Start `lucebox serve` as a background service of this user; returns its pid and log."""
    argv = [sys.executable, "-m", "lucebox.app.cli", "serve", *options.to_args()]
    log = paths.ensure(paths.logs_dir) / "serve.log"
    with log.open("a") as handle:
        proc = subprocess.Popen(
            argv,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return proc.pid, log


def stop_server(paths: Paths, timeout_s: float = 30.0) -> int | None:
    """SIGTERM the running lucebox server and wait for it; returns its pid, or None."""
    status = current_status(paths)
    pid = status["pid"]
    if pid is None:
        return None
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _pid_alive(pid):
        time.sleep(0.1)
    return int(pid)


class ServeLock:
    """One lucebox server per user: held for as long as a server (headless or TUI) runs."""

    def __init__(self, paths: Paths) -> None:
        folder = paths.ensure(paths.runtime_dir)
        self.handle: IO[str] = (folder / LOCK_NAME).open("a+")
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            self.handle.close()
            running = current_status(paths)
            raise AlreadyServingError(
                f"lucebox already serves {running.get('model')} at {running.get('url')} "
                f"(pid {running.get('pid')})",
                hint="`lucebox status` shows it; `lucebox down` stops it",
            ) from exc

    def release(self) -> None:
        self.handle.close()


def download_step(progress: TransferProgress) -> StepEvent:
    """A download's progress as the models step shows it."""
    return StepEvent(
        "models",
        "running",
        f"downloading {progress.name}",
        progress.fraction,
        progress.rate_bytes_per_s,
        progress.eta_s,
    )


def problem_note(problem: guard.Problem) -> StepEvent:
    """A problem the model check found, as a note under the models step."""
    return StepEvent("models", "note", f"{problem.severity} {problem.code}: {problem.message}")


def _download_progress(emit: Emit) -> Callable[[TransferProgress], None]:
    return lambda progress: emit(download_step(progress))


def _build_progress(emit: Emit) -> Callable[[BuildEvent], None]:
    def report(event: BuildEvent) -> None:
        if event.percent is not None:
            emit(StepEvent("engine", "running", "building the engine", event.percent / 100))

    return report


def _pull(paths: Paths, source: str, emit: Emit, cancel: threading.Event | None) -> Path:
    found = planning.local_file(paths, source)
    if found is not None:
        return found
    emit(StepEvent("models", "running", f"looking for {source}"))
    return store.pull_model(
        paths, source, on_progress=_download_progress(emit), cancel=cancel
    ).main_path


def _engine(paths: Paths, probe: gpu.GpuProbe, wanted: str, emit: Emit) -> EngineManifest:
    emit(StepEvent("engine", "running", "looking for an installed engine"))
    engine = registry.select_engine(paths, probe, wanted).engine
    if engine is None:
        emit(StepEvent("engine", "note", "none installed: building it (this takes a while once)"))
        choice = choose_options(probe, toolchain.probe_cuda_toolkit())
        engine, _ = registry.build_and_install(
            paths, ensure_source(paths), choice.options, on_event=_build_progress(emit)
        )
    emit(StepEvent("engine", "done", f"{engine.id} ({engine.version})"))
    return engine


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
    settings = config.load_settings(paths)
    resolved = planning.resolve(options, settings)
    emit(StepEvent("gpu", "running", "looking for an NVIDIA GPU"))
    probe = gpu.probe_gpus()
    found = peers.ask_peers(resolved.rpc)
    budget = planning.budget_for(probe, resolved.gpus, options.vram_mib, peers.peer_devices(found))
    emit(
        StepEvent("gpu", "done", f"{budget.device}, {units.gib_text(budget.vram_free_bytes)} free")
    )
    installed = registry.select_engine(paths, probe, settings.engine).engine
    preset = None
    if options.model:
        emit(StepEvent("preset", "done", f"no preset: serving {options.model}"))
    else:
        emit(StepEvent("preset", "running", "choosing the model set"))
        preset = planning.pick_preset(
            paths, options, settings, budget, planning.EngineView.of(installed)
        )
        emit(StepEvent("preset", "done", f"{preset.id} ({preset.title})"))
    if not dry_run:
        target_source = options.model or (preset.target.source if preset else "")
        _pull(paths, target_source, emit, cancel)
        draft_source = options.draft or (
            preset.draft.model.source if preset and preset.draft and preset.draft.model else None
        )
        if draft_source:
            _pull(paths, draft_source, emit, cancel)
        installed = _engine(paths, probe, settings.engine, emit)
    peers.check_builds(found, planning.EngineView.of(installed).version)
    emit(StepEvent("plan", "running", "sizing context, KV cache and speculation"))
    launch = planning.plan_launch(
        paths,
        options,
        settings=settings,
        budget=budget,
        engine=planning.EngineView.of(installed),
        preset=preset,
    )
    for problem in launch.problems:
        emit(problem_note(problem))
    if launch.refusal is not None:
        raise planning.PlanRefusal(launch, launch.refusal)
    emit(
        StepEvent(
            "models",
            "done",
            launch.target.path.name + (" + draft" if launch.speculation.draft else ""),
        )
    )
    emit(StepEvent("plan", "done", plan_summary(launch)))
    if not dry_run and launch.spec.api_key_file:
        key_path, api_key, created = ensure_api_key_file(paths, settings.api_key)
        if created:
            emit(
                StepEvent("server", "note", f"API key (shown once, kept in {key_path}): {api_key}")
            )
        launch = dataclasses.replace(launch, spec=dataclasses.replace(launch.spec, api_key=api_key))
    # Loading reads the whole file: allow a minute per GiB on top of two minutes.
    size_bytes = launch.target.path.stat().st_size if launch.target.present else 0
    ready_timeout_s = 120 + 60 * size_bytes / 2**30
    gpu_index = launch.spec.gpus[0] if launch.spec.gpus else 0
    return Prepared(launch, settings, gpu_index, ready_timeout_s)


def plan_summary(launch: LaunchPlan) -> str:
    plan = launch.plan
    spec = launch.speculation.spec_type or "no speculation"
    return (
        f"ctx {plan.ctx}, KV {plan.cache_type_k}, {spec}, "
        f"{units.gib_text(plan.memory_bytes.total, 2)} of "
        f"{units.gib_text(launch.budget.vram_free_bytes)}"
    )


def replan_after_oom(paths: Paths, prepared: Prepared) -> Callable[[LaunchSpec], LaunchSpec | None]:
    """The supervisor's out-of-memory re-plan: a new launch plan at a smaller context.

    A context the user asked for is never shrunk: the re-plan refuses (exit 3) instead.
    """
    current = prepared.launch

    def replan(spec: LaunchSpec) -> LaunchSpec | None:
        nonlocal current
        smaller = planning.smaller_context_plan(paths, current, prepared.settings)
        if smaller.refusal is not None:
            return None
        current = smaller
        return dataclasses.replace(smaller.spec, api_key=spec.api_key)

    return replan


def new_supervisor(paths: Paths, prepared: Prepared) -> Supervisor:
    return Supervisor(
        prepared.spec,
        engine_log(paths),
        ready_timeout_s=prepared.ready_timeout_s,
        replan_on_oom=replan_after_oom(paths, prepared),
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
    supervisor = new_supervisor(paths, prepared)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, supervisor.stop)
    exit_code = 0
    async for item in run_server(paths, prepared, supervisor):
        if isinstance(item, ServerEvent):
            state: StepState = "failed" if item.kind in ("gave-up", "exited") else "running"
            emit(StepEvent("server", state, f"{item.kind}: {item.message}"))
            if item.kind == "gave-up":
                exit_code = 1
    return exit_code


async def run_server(
    paths: Paths, prepared: Prepared, supervisor: Supervisor
) -> AsyncIterator[ServerEvent | Sample]:
    """Supervise the engine and sample it once ready; yields both streams as they come.

    Keeps the state file that `lucebox status` reads, and removes it when the server ends.
    """
    spec = prepared.spec
    state: dict[str, Any] = {
        "pid": os.getpid(),
        "url": url_of(spec),
        "model": prepared.model,
        "started_at": time.time(),
        "state": "starting",
        "restarts": 0,
        "engine_pid": None,
        "sample": None,
        "log": str(engine_log(paths)),
        "webui_url": webui.served_url(spec.server_path, spec.host, spec.port),
    }

    def save() -> None:
        write_text_atomic(state_file(paths), json.dumps(state), durable=False)

    queue: asyncio.Queue[ServerEvent | Sample | None] = asyncio.Queue()
    sampler_task: asyncio.Task[None] | None = None

    async def follow_supervisor() -> None:
        try:
            async for event in supervisor.events():
                await queue.put(event)
        finally:
            await queue.put(None)

    supervising = asyncio.create_task(follow_supervisor())
    try:
        while (item := await queue.get()) is not None:
            if isinstance(item, ServerEvent):
                state.update(state=state_of(item), restarts=item.restarts, engine_pid=item.pid)
                if item.kind == "ready" and item.pid is not None:
                    if sampler_task is not None:
                        sampler_task.cancel()
                    sampler_task = asyncio.create_task(
                        _sample(spec, item.pid, prepared.gpu_index, state, queue)
                    )
                elif sampler_task is not None and item.kind != "ready":
                    sampler_task.cancel()
                    sampler_task = None
            save()
            yield item
    finally:
        supervisor.stop()
        if sampler_task is not None:
            sampler_task.cancel()
        for task in (sampler_task, supervising):
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        state_file(paths).unlink(missing_ok=True)


def state_of(event: ServerEvent) -> str:
    return {
        "starting": "starting",
        "loading": "loading",
        "ready": "ready",
        "exited": "restarting",
        "restarting": "restarting",
        "gave-up": "failed",
        "stopped": "stopped",
    }[event.kind]


async def _sample(
    spec: LaunchSpec,
    engine_pid: int,
    gpu_index: int,
    state: dict[str, Any],
    queue: asyncio.Queue[ServerEvent | Sample | None],
) -> None:
    nvml = gpu.PynvmlProvider()
    try:
        nvml.init()
    except gpu.NvmlUnavailableError:
        nvml_or_none = None
    else:
        nvml_or_none = nvml
    sampler = Sampler(
        url_of(spec), engine_pid, nvml=nvml_or_none, gpu_index=gpu_index, api_key=spec.api_key
    )
    last: Sample | None = None
    try:
        async for sample in sampler.samples():
            await queue.put(sample)
            # Status shows the last known rate, not an idle second's missing one.
            last = with_last_rates(last, sample)
            state["sample"] = last.to_json()
    finally:
        if nvml_or_none is not None:
            with contextlib.suppress(gpu.NvmlNotSupportedError, gpu.NvmlUnavailableError):
                nvml.shutdown()
