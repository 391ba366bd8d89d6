"""The memory a plan may use: each device's total and free bytes, and their sums."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceBudget:
    """One device of a budget: a GPU (NVML index), or an RPC peer's device; name and memory."""

    index: int
    name: str
    vram_total_bytes: int
    vram_free_bytes: int
    address: str = ""
    """``host:port`` of the RPC peer offering this device; empty for a GPU of this PC."""

    @property
    def label(self) -> str:
        """How plans name it: ``GPU 0: NVIDIA GeForce RTX 4090``, a peer, a hypothetical card."""
        if self.address:
            return f"peer {self.address}: {self.name}"
        return self.name if self.name.startswith("a ") else f"GPU {self.index}: {self.name}"


@dataclass(frozen=True)
class GpuBudget:
    """Memory the plan may use: GPUs' free VRAM (summed), or RAM for a CPU-only plan."""

    device: str
    vram_total_bytes: int
    vram_free_bytes: int
    is_gpu: bool
    host_total_bytes: int = 0
    """System RAM of this PC: the engine's host-RAM prompt cache lives there."""
    devices: tuple[DeviceBudget, ...] = ()
    """The GPUs behind the sums, when there are several (one GPU needs no split)."""

    @property
    def device_count(self) -> int:
        return max(1, len(self.devices)) if self.is_gpu else 1
