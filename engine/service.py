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
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

from lucebox.engine import config, gpu, guard, pipeline, registry, store, toolchain
from lucebox.engine.atomic import write_text_atomic
from lucebox.engine.build import BuildEvent, choose_options, estimate_left_s
from lucebox.engine.errors import GuardRefusal, LuceboxError
from lucebox.engine.launch import LaunchSpec, is_loopback, new_api_key, url_of
from lucebox.engine.metrics import Sample, Sampler, with_last_rates
from lucebox.engine.paths import Paths
from lucebox.engine.plan import Plan
from lucebox.engine.presets import find_preset
from lucebox.engine.source import ensure_source
from lucebox.engine.supervisor import ServerEvent, Supervisor
from lucebox.engine.transfer import TransferProgress

STATE_NAME = "serve.json"
LOCK_NAME = "serve.lock"


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
