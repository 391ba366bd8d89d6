"""NVML probe: what NVIDIA GPUs this machine has and how much of each is free.

No NVML library, no driver or no GPU is a normal result (``GpuProbe.gpus`` is empty and
``status`` says why), never an exception. A query a GPU does not support gives ``None``,
which front ends render as "not available". The NVML calls go through an injectable
``NvmlProvider`` so tests can script GPUs on machines without one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

import psutil

T = TypeVar("T")

ProbeStatus = Literal["ok", "no-nvml", "no-driver", "no-gpu", "error"]


class NvmlUnavailableError(Exception):
    """NVML cannot be used at all: library missing, driver not loaded, or it failed to init."""

    def __init__(self, status: ProbeStatus, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class NvmlNotSupportedError(Exception):
    """One query is not supported by this GPU or driver, or is not permitted."""


class NvmlProvider(Protocol):
    """The NVML calls lucebox makes, in plain Python values.

    Implementations raise ``NvmlUnavailableError`` from ``init`` and
    ``NvmlNotSupportedError`` from any query the device cannot answer.
    """

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def driver_version(self) -> str: ...
    def cuda_driver_version(self) -> int: ...
    def device_count(self) -> int: ...
    def name(self, index: int) -> str: ...
    def uuid(self, index: int) -> str: ...
    def memory_bytes(self, index: int) -> tuple[int, int, int]:
        """Total, free and used bytes."""
        ...

    def compute_capability(self, index: int) -> tuple[int, int]: ...
    def power_limit_mw(self, index: int) -> int: ...
    def power_draw_mw(self, index: int) -> int: ...
    def temperature_c(self, index: int) -> int: ...
    def utilization_percent(self, index: int) -> int: ...
    def mig_enabled(self, index: int) -> bool: ...
    def processes(self, index: int) -> list[tuple[int, int | None]]:
        """(pid, bytes used or None when the driver does not say) of every process on it."""
        ...


@dataclass(frozen=True)
class GpuProcessInfo:
    """Another process holding memory on a GPU."""

    pid: int
    name: str
    used_bytes: int | None


@dataclass(frozen=True)
class GpuInfo:
    """One NVIDIA GPU as NVML sees it; ``None`` means the GPU does not report that value."""

    index: int
    name: str
    uuid: str
    vram_total_bytes: int
    vram_free_bytes: int
    vram_used_bytes: int
    compute_capability: str | None
    """"8.6", "9.0", ... """
    cuda_arch: str | None
    """The matching CMAKE_CUDA_ARCHITECTURES value: "86", "90", ... """
    power_limit_w: float | None
    power_draw_w: float | None
    temperature_c: int | None
    utilization_percent: int | None
    mig_enabled: bool | None
    processes: tuple[GpuProcessInfo, ...]


@dataclass(frozen=True)
class GpuProbe:
    """The result of one probe: the GPUs, or why there are none."""

    status: ProbeStatus
    detail: str
    driver_version: str | None
    cuda_driver_version: str | None
    """"13.0" for the CUDA version the driver supports."""
    gpus: tuple[GpuInfo, ...]

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpus)


def cuda_arch(major: int, minor: int) -> str:
    """CMAKE_CUDA_ARCHITECTURES value for a compute capability: (8, 6) -> "86"."""
    return f"{major}{minor}"


def format_cuda_version(encoded: int) -> str:
    """NVML's CUDA driver version integer as text: 13000 -> "13.0", 12040 -> "12.4"."""
    return f"{encoded // 1000}.{(encoded % 1000) // 10}"


def _optional(query: Callable[[], T]) -> T | None:
    try:
        return query()
    except NvmlNotSupportedError:
        return None


def _process_name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except (psutil.Error, OSError):
        # NVML sees pids of other containers and users that psutil cannot name.
        return f"pid {pid}"


def _probe_gpu(nvml: NvmlProvider, index: int) -> GpuInfo:
    total, free, used = nvml.memory_bytes(index)
    capability = _optional(lambda: nvml.compute_capability(index))
    power_limit_mw = _optional(lambda: nvml.power_limit_mw(index))
    power_draw_mw = _optional(lambda: nvml.power_draw_mw(index))
    raw_processes = _optional(lambda: nvml.processes(index)) or []
    return GpuInfo(
        index=index,
        name=nvml.name(index),
        uuid=_optional(lambda: nvml.uuid(index)) or "",
        vram_total_bytes=total,
        vram_free_bytes=free,
        vram_used_bytes=used,
        compute_capability=f"{capability[0]}.{capability[1]}" if capability else None,
        cuda_arch=cuda_arch(*capability) if capability else None,
        power_limit_w=power_limit_mw / 1000 if power_limit_mw is not None else None,
        power_draw_w=power_draw_mw / 1000 if power_draw_mw is not None else None,
        temperature_c=_optional(lambda: nvml.temperature_c(index)),
        utilization_percent=_optional(lambda: nvml.utilization_percent(index)),
        mig_enabled=_optional(lambda: nvml.mig_enabled(index)),
        processes=tuple(
            GpuProcessInfo(pid=pid, name=_process_name(pid), used_bytes=used_bytes)
            for pid, used_bytes in raw_processes
        ),
    )


def probe_gpus(nvml: NvmlProvider | None = None) -> GpuProbe:
    """Ask NVML for every GPU; never raises for a machine without a usable NVIDIA GPU."""
    provider = nvml if nvml is not None else PynvmlProvider()
    try:
        provider.init()
    except NvmlUnavailableError as exc:
        return GpuProbe(exc.status, exc.detail, None, None, ())
    try:
        driver = _optional(provider.driver_version)
        cuda = _optional(provider.cuda_driver_version)
        cuda_text = format_cuda_version(cuda) if cuda else None
        try:
            count = provider.device_count()
            gpus = tuple(_probe_gpu(provider, index) for index in range(count))
        except (NvmlNotSupportedError, NvmlUnavailableError) as exc:
            return GpuProbe(
                "error", f"NVML failed while listing GPUs: {exc}", driver, cuda_text, ()
            )
        if not gpus:
            return GpuProbe("no-gpu", "no NVIDIA GPU: NVML found none", driver, cuda_text, ())
        return GpuProbe("ok", f"{len(gpus)} NVIDIA GPU(s)", driver, cuda_text, gpus)
    finally:
        with contextlib.suppress(NvmlNotSupportedError, NvmlUnavailableError):
            provider.shutdown()


class PynvmlProvider:
    """``NvmlProvider`` backed by nvidia-ml-py (``pynvml``)."""

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml

    def _call(self, name: str, *args: object) -> Any:
        nvml = self._nvml
        try:
            return getattr(nvml, name)(*args)
        except nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code in (nvml.NVML_ERROR_LIBRARY_NOT_FOUND, nvml.NVML_ERROR_DRIVER_NOT_LOADED):
                raise NvmlUnavailableError("no-driver", f"no NVIDIA GPU: {exc}") from exc
            raise NvmlNotSupportedError(str(exc)) from exc

    def _handle(self, index: int) -> Any:
        return self._call("nvmlDeviceGetHandleByIndex", index)

    def init(self) -> None:
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == nvml.NVML_ERROR_LIBRARY_NOT_FOUND:
                raise NvmlUnavailableError(
                    "no-nvml", "no NVIDIA GPU: the NVIDIA driver's NVML library is not installed"
                ) from exc
            if code == nvml.NVML_ERROR_DRIVER_NOT_LOADED:
                raise NvmlUnavailableError(
                    "no-driver", "no NVIDIA GPU: the NVIDIA driver is not loaded"
                ) from exc
            raise NvmlUnavailableError(
                "error", f"no NVIDIA GPU: NVML failed to start: {exc}"
            ) from exc

    def shutdown(self) -> None:
        self._call("nvmlShutdown")

    def driver_version(self) -> str:
        value = self._call("nvmlSystemGetDriverVersion")
        return value.decode() if isinstance(value, bytes) else str(value)

    def cuda_driver_version(self) -> int:
        return int(self._call("nvmlSystemGetCudaDriverVersion"))

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def name(self, index: int) -> str:
        value = self._call("nvmlDeviceGetName", self._handle(index))
        return value.decode() if isinstance(value, bytes) else str(value)

    def uuid(self, index: int) -> str:
        value = self._call("nvmlDeviceGetUUID", self._handle(index))
        return value.decode() if isinstance(value, bytes) else str(value)

    def memory_bytes(self, index: int) -> tuple[int, int, int]:
        info = self._call("nvmlDeviceGetMemoryInfo", self._handle(index))
        return int(info.total), int(info.free), int(info.used)

    def compute_capability(self, index: int) -> tuple[int, int]:
        capability = self._call("nvmlDeviceGetCudaComputeCapability", self._handle(index))
        return int(capability[0]), int(capability[1])

    def power_limit_mw(self, index: int) -> int:
        return int(self._call("nvmlDeviceGetPowerManagementLimit", self._handle(index)))

    def power_draw_mw(self, index: int) -> int:
        return int(self._call("nvmlDeviceGetPowerUsage", self._handle(index)))

    def temperature_c(self, index: int) -> int:
        handle = self._handle(index)
        return int(self._call("nvmlDeviceGetTemperature", handle, self._nvml.NVML_TEMPERATURE_GPU))

    def utilization_percent(self, index: int) -> int:
        rates = self._call("nvmlDeviceGetUtilizationRates", self._handle(index))
        return int(rates.gpu)

    def mig_enabled(self, index: int) -> bool:
        modes = self._call("nvmlDeviceGetMigMode", self._handle(index))
        return bool(modes[0] == self._nvml.NVML_DEVICE_MIG_ENABLE)

    def processes(self, index: int) -> list[tuple[int, int | None]]:
        handle = self._handle(index)
        seen: dict[int, int | None] = {}
        for query in (
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetGraphicsRunningProcesses",
        ):
            for proc in self._call(query, handle):
                used = proc.usedGpuMemory
                seen[int(proc.pid)] = int(used) if used is not None else None
        return sorted(seen.items())
