"""The engine rebuilt for a lower CPU baseline after it died of an illegal instruction."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from lucebox.engine.core.errors import LuceboxError
from lucebox.engine.engines import cputarget
from lucebox.engine.plan.launch import ServerLaunch
from lucebox.engine.run.supervision.enginelog import RotatingLog

CpuRebuild = Callable[[ServerLaunch, str, threading.Event], ServerLaunch]
"""Builds the served engine's version again for a CPU baseline and returns the launch on it
(minutes, in a thread; it stops when the event is set)."""


def baseline_below(cpu_target: str | None) -> str | None:
    """The next CPU baseline down from ``cpu_target``; None when there is none."""
    below = cputarget.below(cpu_target)
    return below.name if below is not None else None


async def rebuild(
    rebuild_for_cpu: CpuRebuild,
    launch: ServerLaunch,
    target: str,
    stopping: asyncio.Event,
    log: RotatingLog,
) -> ServerLaunch | str:
    """The launch on the engine rebuilt for ``target``, or why there is none (the build
    failed, or a stop cancelled it)."""
    cancel = threading.Event()
    building = asyncio.create_task(asyncio.to_thread(rebuild_for_cpu, launch, target, cancel))
    stopping_wait = asyncio.create_task(stopping.wait())
    await asyncio.wait({building, stopping_wait}, return_when=asyncio.FIRST_COMPLETED)
    stopping_wait.cancel()
    if not building.done():
        cancel.set()  # the build stops at its next line of output
    try:
        return await building
    except LuceboxError as exc:
        log.write(f"# lucebox: the rebuild for {target} failed: {exc.message}")
        return exc.message
