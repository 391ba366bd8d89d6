"""The cards a run samples: NVML opened for the run, and each card's memory and load now
(a single server's run and a served set's both show them in status)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from lucebox.engine.machine import gpu
from lucebox.engine.machine.gpu import NvmlNotSupportedError, NvmlProvider
from lucebox.engine.run.sample import GpuStatus


@contextlib.contextmanager
def nvml_session() -> Iterator[NvmlProvider | None]:
    """NVML opened for a run's sampling (None without a GPU or driver), closed after it."""
    provider = gpu.PynvmlProvider()
    try:
        provider.init()
    except gpu.NvmlUnavailableError:
        yield None
        return
    try:
        yield provider
    finally:
        with contextlib.suppress(gpu.NvmlNotSupportedError, gpu.NvmlUnavailableError):
            provider.shutdown()


def gpu_statuses(nvml: NvmlProvider) -> tuple[GpuStatus, ...]:
    """Every NVIDIA GPU's memory and load now (a split engine uses several)."""

    found = []
    for index in range(nvml.device_count()):
        try:
            total, _, used = nvml.memory_bytes(index)
        except NvmlNotSupportedError:
            continue
        try:
            util: int | None = nvml.utilization_percent(index)
        except NvmlNotSupportedError:
            util = None
        found.append(GpuStatus(index, used, total, util))
    return tuple(found)
