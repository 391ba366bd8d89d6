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
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from lucebox.engine import config, gpu, guard, pipeline, registry, store, toolchain
from lucebox.engine.atomic import write_text_atomic
from lucebox.engine.build import BuildEvent, choose_options
from lucebox.engine.errors import GuardRefusal, LuceboxError
from lucebox.engine.launch import LaunchSpec, is_loopback, new_api_key, url_of
from lucebox.engine.metrics import Sample, Sampler, with_last_rates
from lucebox.engine.paths import Paths
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


class _Lock:
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


Emit = Callable[[str], None]


def _download_progress(emit: Emit) -> Callable[[TransferProgress], None]:
    """Turn download progress into a line every 5% (the log of a headless service)."""
    last = [-1]

    def report(event: TransferProgress) -> None:
        fraction = event.fraction
        if fraction is None or int(fraction * 20) == last[0]:
            return
        last[0] = int(fraction * 20)
        eta = f", {event.eta_s:.0f} s left" if event.eta_s is not None else ""
        emit(
            f"download {event.name}: {fraction:.0%} at "
            f"{event.rate_bytes_per_s / 2**20:.1f} MiB/s{eta}"
        )

    return report


def _build_progress(emit: Emit) -> Callable[[BuildEvent], None]:
    """A line at every 10% of the engine build."""
    last = [-1]

    def report(event: BuildEvent) -> None:
        if event.percent is not None and event.percent // 10 > last[0]:
            last[0] = event.percent // 10
            emit(f"engine build: {event.percent}%")

    return report


def _prepare(paths: Paths, options: ServeOptions, emit: Emit) -> tuple[LaunchSpec, str, int]:
    """Everything before the engine starts; returns the launch spec, a model name, GPU index."""
    settings = config.load_settings(paths)
    probe = gpu.probe_gpus()
    gpu_index = options.gpu_index if options.gpu_index is not None else settings.gpu_index
    budget = pipeline.budget_for(probe, gpu_index)
    emit(f"device: {budget.device}, {budget.free_bytes / 2**30:.1f} GiB free")
    allow_base = options.allow_base or settings.allow_base
    preset = None
    if options.model:
        target_source = options.model
    else:
        preset = pipeline.pick_preset(paths, budget, options.preset or settings.preset).preset
        emit(f"preset: {preset.id} ({preset.title})")
        target_source = preset.target.source

    target_path = pipeline.local_file(paths, target_source)
    if target_path is None:
        emit(f"model: pulling {target_source}")
        target_path = store.pull_model(
            paths, target_source, on_progress=_download_progress(emit)
        ).main_path
    selection = registry.select_engine(paths, probe, settings.engine)
    engine = selection.engine
    if engine is None:
        emit("engine: none installed, building it (this takes a while once)")
        choice = choose_options(probe, toolchain.probe_cuda_toolkit())
        engine, _ = registry.build_and_install(
            paths, ensure_source(paths), choice.options, on_event=_build_progress(emit)
        )
    emit(f"engine: {engine.id} ({engine.version})")
    archs = registry.known_model_archs(paths, registry.EngineSelection(engine, ""))
    template = preset.chat_template if preset else None
    checked = guard.check_model(
        target_path,
        allow_base=allow_base or bool(template),
        template_supplied=bool(template),
        known_archs=archs,
    )
    for problem in checked.problems:
        emit(f"model check: {problem.severity} {problem.code}: {problem.message}")
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
                emit(f"draft: pulling {preset.draft.model.source}")
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
                emit("draft: refused by its guard, serving without speculation")
                spec_type = None
    facts = pipeline.facts_for(paths, target_path, engine)
    ctx = options.ctx or settings.ctx or None
    plan = pipeline.plan_model(facts, budget, ctx, engine)
    if not plan.fits:
        raise GuardRefusal(
            f"the plan does not fit: {plan.reasons.get('ctx', '')}",
            hint=f"the largest context that fits is {plan.largest_ctx} tokens",
        )
    emit(
        f"plan: ctx {plan.ctx}, KV {plan.cache_type_k}, "
        f"{plan.memory_bytes.total / 2**30:.2f} GiB of {budget.free_bytes / 2**30:.1f} GiB"
    )
    host = options.host or settings.host
    api_key = settings.api_key or None
    if not is_loopback(host) and api_key is None:
        api_key = new_api_key()
        config.set_setting(paths, "server.api_key", api_key)
        emit(f"API key (shown once, saved as server.api_key): {api_key}")
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
    return spec, spec.alias, gpu_index


def _smaller_context(spec: LaunchSpec) -> LaunchSpec | None:
    """Re-plan at three quarters of the context after an out-of-memory start."""
    ctx = (spec.plan.ctx * 3 // 4) // 256 * 256
    if ctx < 2048:
        return None
    return dataclasses.replace(spec, plan=dataclasses.replace(spec.plan, ctx=ctx))


def serve(paths: Paths, options: ServeOptions, emit: Emit) -> int:
    """Run the pipeline in the foreground until SIGINT/SIGTERM or a crash loop."""
    lock = _Lock(paths)
    try:
        spec, model, gpu_index = _prepare(paths, options, emit)
        # Loading reads the whole file: allow a minute per GiB on top of two minutes.
        ready_timeout_s = 120 + 60 * Path(spec.model_path).stat().st_size / 2**30
        return asyncio.run(_supervise(paths, spec, model, gpu_index, ready_timeout_s, emit))
    finally:
        state_file(paths).unlink(missing_ok=True)
        lock.release()


async def _supervise(
    paths: Paths,
    spec: LaunchSpec,
    model: str,
    gpu_index: int,
    ready_timeout_s: float,
    emit: Emit,
) -> int:
    supervisor = Supervisor(
        spec, engine_log(paths), ready_timeout_s=ready_timeout_s, replan_on_oom=_smaller_context
    )
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, supervisor.stop)
    state: dict[str, Any] = {
        "pid": os.getpid(),
        "url": url_of(spec),
        "model": model,
        "started_at": time.time(),
        "state": "starting",
        "restarts": 0,
        "engine_pid": None,
        "sample": None,
        "log": str(engine_log(paths)),
    }

    def save() -> None:
        write_text_atomic(state_file(paths), json.dumps(state))

    sampler_task: asyncio.Task[None] | None = None
    exit_code = 0
    try:
        async for event in supervisor.events():
            emit(f"server: {event.kind}: {event.message}")
            state.update(state=_state_of(event), restarts=event.restarts, engine_pid=event.pid)
            save()
            if event.kind == "ready" and event.pid is not None:
                if sampler_task is not None:
                    sampler_task.cancel()
                sampler_task = asyncio.create_task(_sample(spec, event.pid, gpu_index, state, save))
            if event.kind == "gave-up":
                exit_code = 1
    finally:
        if sampler_task is not None:
            sampler_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler_task
    return exit_code


def _state_of(event: ServerEvent) -> str:
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
    save: Callable[[], None],
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
            # Status shows the last known rate, not an idle second's missing one.
            sample = with_last_rates(last, sample)
            last = sample
            state["sample"] = sample.to_json()
            save()
    finally:
        if nvml_or_none is not None:
            with contextlib.suppress(gpu.NvmlNotSupportedError, gpu.NvmlUnavailableError):
                nvml.shutdown()
