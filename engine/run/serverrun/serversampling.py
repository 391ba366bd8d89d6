"""The ready engine sampled and watched for hangs: its log's reader and its sampler, the time
to first token its clients waited, and the hang watch that kills an engine whose request
makes no progress."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from lucebox.engine.core.paths import Paths
from lucebox.engine.machine.gpu import NvmlProvider
from lucebox.engine.plan.launch import ServerLaunch
from lucebox.engine.plan.memory.cpuread import cpu_cores
from lucebox.engine.plan.prefillrates import PrefillRecorder
from lucebox.engine.run.front.front import Front
from lucebox.engine.run.hang import HangBounds, Watch, chosen_look, hung, observe
from lucebox.engine.run.kinds.enginelog import EngineLog
from lucebox.engine.run.kinds.enginerun import engine_run
from lucebox.engine.run.kinds.metrics import Sampler
from lucebox.engine.run.sample import Sample
from lucebox.engine.run.serverrun.serverstatus import RunState
from lucebox.engine.run.supervisor import Supervisor

HANG_CHECK_S = 1.0
"""The hang watch looks as often as the sampler samples."""


def engine_sampler(
    launch: ServerLaunch,
    url: str,
    engine_pid: int,
    log: EngineLog,
    *,
    nvml: NvmlProvider | None,
    gpu_index: int,
    api_key: str | None,
    spec_reason: str | None,
) -> Sampler:
    """The sampler of engine ``engine_pid`` at ``url``, for the kind of engine ``launch`` runs."""
    options: dict[str, Any] = dict(nvml=nvml, gpu_index=gpu_index, api_key=api_key)
    options.update(gpu_indices=launch.gpus)
    options.update(spec_type=launch.spec_type, spec_reason=spec_reason)
    return engine_run(launch.kind).sampler(url, engine_pid, log, **options)


def log_reader(supervisor: Supervisor) -> EngineLog:
    """What reads the engine's lines, for the kind of engine that runs; the requests it
    reports finished leave out lucebox's own."""
    log = engine_run(supervisor.launch.kind).engine_log()
    log.own = supervisor.own_requests
    log.own.new_engine()
    return log


def cpu_prefill(paths: Paths, launch: ServerLaunch) -> PrefillRecorder | None:
    """What keeps the prefill rates a CPU run measures; None for a run on a GPU."""
    if launch.plan.n_gpu_layers == 0 and not launch.rpc:
        return PrefillRecorder(paths, Path(launch.model_path), cpu_cores())
    return None


def with_client_waits(sample: Sample, front: Front | None) -> Sample:
    """``sample`` with the time to first token its clients waited, where the front saw
    streamed answers (the engine's own clock leaves out the request's way in and its
    parse); the engine's figures stand where none streamed."""
    if front is None:
        return sample
    window, last = front.queue.first_token_s(time.monotonic(), sample.window_s)
    if window is None:
        return sample
    return replace(sample, ttft_s=window, last_ttft_s=last)


async def watch_hang(
    sampler: Sampler,
    bounds: HangBounds,
    supervisor: Supervisor,
    front: Callable[[], Front | None],
    run: RunState,
) -> None:
    """Kill and restart an engine whose running request makes no progress within the
    bound of its phase (:mod:`hang`): the sampler's latest look, checked each second
    whether the engine answers or not; ``run`` holds the latest sample's prefill rate."""
    watch = Watch()
    while True:
        await asyncio.sleep(HANG_CHECK_S)
        now_s = time.monotonic()
        serving_front = front()
        front_look = serving_front.queue.engine_look(now_s) if serving_front else None
        watch = observe(watch, chosen_look(watch, sampler.look, front_look), now_s)
        sample = run.sample
        rate = sample.last_prefill_tokens_per_s if sample is not None else None
        why = hung(watch, now_s, rate, bounds)
        if why is not None:
            supervisor.log.write(f"# lucebox: hang: {why}")
            supervisor.hung(why)
            return


@contextlib.asynccontextmanager
async def hang_watched(
    sampler: Sampler,
    bounds: HangBounds | None,
    supervisor: Supervisor,
    front: Callable[[], Front | None],
    run: RunState,
) -> AsyncIterator[None]:
    """The hang watch (:func:`watch_hang`) running while the body samples; None bounds: none."""
    if bounds is None:
        yield
        return
    bounds = replace(bounds, silent_factor=sampler.silent_factor)
    watching = asyncio.create_task(watch_hang(sampler, bounds, supervisor, front, run))
    try:
        yield
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
