"""The memory a plan may use: this PC's GPUs, RPC peers' devices or the RAM, and their sums."""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from lucebox.engine.core.errors import UsageError
from lucebox.engine.core.units import MIB
from lucebox.engine.machine.gpu import GpuProbe


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

    @property
    def local_gpus(self) -> tuple[DeviceBudget, ...]:
        """This PC's own GPUs among the devices (RPC peers' devices left out)."""
        return tuple(d for d in self.devices if not d.address) if self.is_gpu else ()


def budget_for(
    probe: GpuProbe,
    gpus: tuple[int, ...] = (),
    vram_mib: tuple[int, ...] | None = None,
    peers: tuple[DeviceBudget, ...] = (),
) -> GpuBudget:
    """The memory a plan may use: RPC peers' devices (first: see below) and hypothetical
    cards (--vram-mib), the GPUs, or the RAM.

    The engine's device list is the RPC devices first, in --rpc order, then this PC's GPUs
    (llama_model_load in src/llama.cpp of the pinned source: "add RPC servers at the front of
    the list"); --tensor-split and --main-gpu index that list, so the budget keeps its order.
    """
    host_total = psutil.virtual_memory().total
    if vram_mib:
        cards = tuple(
            DeviceBudget(i, f"a {mib} MiB card", mib * MIB, mib * MIB)
            for i, mib in enumerate(vram_mib)
        )
        return pool_of(peers + cards, host_total)
    known = {gpu.index: gpu for gpu in probe.gpus}
    missing = [i for i in gpus if i not in known]
    if missing:
        found = ", ".join(str(i) for i in known) or "none"
        raise UsageError(
            f"there is no GPU {', '.join(map(str, missing))} (NVIDIA GPUs here: {found})",
            hint="pick from `lucebox doctor`'s list with --gpus, or leave it out to use them all",
        )
    if known:
        chosen = [known[i] for i in gpus] if gpus else list(known.values())
        devices = tuple(
            DeviceBudget(g.index, g.name, g.vram_total_bytes, g.vram_free_bytes) for g in chosen
        )
        return pool_of(peers + devices, host_total)
    if peers:
        # No GPU here: the layers go to the peers, the CPU keeps the token embeddings.
        return pool_of(peers, host_total)
    memory = psutil.virtual_memory()
    return GpuBudget(
        "CPU (no NVIDIA GPU): system RAM", memory.total, memory.available, is_gpu=False
    )


def pool_of(devices: tuple[DeviceBudget, ...], host_total_bytes: int) -> GpuBudget:
    """One budget over ``devices``: their sums, named after them."""
    names = [d.label for d in devices]
    return GpuBudget(
        names[0] if len(names) == 1 else " + ".join(names),
        sum(d.vram_total_bytes for d in devices),
        sum(d.vram_free_bytes for d in devices),
        is_gpu=True,
        host_total_bytes=host_total_bytes,
        devices=devices,
    )
