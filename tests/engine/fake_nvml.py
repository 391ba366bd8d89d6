"""A scripted ``NvmlProvider`` for machines without an NVIDIA GPU."""

from __future__ import annotations

from dataclasses import dataclass, field

from lucebox.engine.machine.gpu import NvmlNotSupportedError, NvmlUnavailableError, ProbeStatus

GIB = 1024**3


@dataclass
class FakeGpu:
    name: str = "NVIDIA GeForce RTX 3090"
    total_bytes: int = 24 * GIB
    used_bytes: int = 300 * 1024**2
    capability: tuple[int, int] = (8, 6)
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    mig: bool | None = False
    unsupported: frozenset[str] = frozenset()
    """Names of queries this card answers with NOT_SUPPORTED."""


@dataclass
class FakeNvml:
    gpus: list[FakeGpu] = field(default_factory=list)
    init_failure: ProbeStatus | None = None
    driver: str = "580.159.04"
    cuda: int = 13000
    shut_down: bool = False

    def _gpu(self, index: int, query: str) -> FakeGpu:
        gpu = self.gpus[index]
        if query in gpu.unsupported:
            raise NvmlNotSupportedError("Not Supported")
        return gpu

    def init(self) -> None:
        if self.init_failure is not None:
            raise NvmlUnavailableError(self.init_failure, f"no NVIDIA GPU: {self.init_failure}")

    def shutdown(self) -> None:
        self.shut_down = True

    def driver_version(self) -> str:
        return self.driver

    def cuda_driver_version(self) -> int:
        return self.cuda

    def device_count(self) -> int:
        return len(self.gpus)

    def name(self, index: int) -> str:
        return self._gpu(index, "name").name

    def uuid(self, index: int) -> str:
        self._gpu(index, "uuid")
        return f"GPU-0000000{index}-fake"

    def memory_bytes(self, index: int) -> tuple[int, int, int]:
        gpu = self._gpu(index, "memory_bytes")
        used = gpu.used_bytes + sum(b or 0 for _, b in gpu.processes)
        return gpu.total_bytes, gpu.total_bytes - used, used

    def compute_capability(self, index: int) -> tuple[int, int]:
        return self._gpu(index, "compute_capability").capability

    def power_limit_mw(self, index: int) -> int:
        self._gpu(index, "power_limit_mw")
        return 350_000

    def power_draw_mw(self, index: int) -> int:
        self._gpu(index, "power_draw_mw")
        return 42_500

    def temperature_c(self, index: int) -> int:
        self._gpu(index, "temperature_c")
        return 41

    def utilization_percent(self, index: int) -> int:
        self._gpu(index, "utilization_percent")
        return 7

    def mig_enabled(self, index: int) -> bool:
        gpu = self._gpu(index, "mig_enabled")
        if gpu.mig is None:
            raise NvmlNotSupportedError("Not Supported")
        return gpu.mig

    def processes(self, index: int) -> list[tuple[int, int | None]]:
        return list(self._gpu(index, "processes").processes)
