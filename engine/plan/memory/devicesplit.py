"""Several devices (GPUs of this PC, RPC peers): how the engine deals layers over them with
--tensor-split, and what each device then holds."""

from __future__ import annotations

from lucebox.engine.machine.budget import GpuBudget
from lucebox.engine.models.modelfacts import ModelFacts
from lucebox.engine.plan.memory.sizes import (
    CUDA_CONTEXT_BYTES,
    RESERVE_FRACTION,
    RESERVE_MIN_BYTES,
    MemoryBytes,
)


def split_over_devices(
    budget: GpuBudget, memory: MemoryBytes, target: ModelFacts, n_gpu_layers: int, n_cpu_moe: int
) -> tuple[tuple[float, ...], int, tuple[tuple[str, int], ...]]:
    """Layer shares per device in proportion to each one's room, and each device's total."""
    if len(budget.devices) < 2 or not budget.is_gpu:
        return (), 0, ((budget.device, memory.total),)
    count = len(budget.devices)
    per_device_fixed = CUDA_CONTEXT_BYTES + memory.compute // count
    rooms = [
        max(
            0, d.vram_free_bytes - max(RESERVE_MIN_BYTES, int(d.vram_free_bytes * RESERVE_FRACTION))
        )
        - per_device_fixed
        for d in budget.devices
    ]
    everything_offloaded = n_gpu_layers < 0 and not n_cpu_moe
    holder = count - 1
    if everything_offloaded:
        # The engine puts the output matrix on the last device that gets layers: the last
        # one with room for it; the devices after it get none.
        output = memory.weights - min(target.layer_bytes, memory.weights)
        holder = max((i for i, r in enumerate(rooms) if r >= output), default=count - 1)
        rooms = [r if i < holder else r - output if i == holder else 0 for i, r in enumerate(rooms)]
    total_room = max(sum(max(r, 0) for r in rooms), 1)
    shares = tuple(round(max(r, 0) / total_room, 3) for r in rooms)
    if everything_offloaded:
        shares = _slot_counts(rooms, memory, target, holder)
        spread = _by_layer(shares, memory, target)
    else:
        spread = [
            int((memory.weights + memory.kv + memory.draft) * max(r, 0) / total_room) for r in rooms
        ]
    per_device = tuple(
        (d.label, per_device_fixed + part) for d, part in zip(budget.devices, spread, strict=True)
    )
    main = max(range(count), key=lambda i: rooms[i])
    return shares, main, per_device


def _slot_counts(
    rooms: list[int], memory: MemoryBytes, target: ModelFacts, holder: int
) -> tuple[float, ...]:
    """Whole layers per device (``holder`` also gets the output slot), as --tensor-split.

    Shares given as slot counts place exactly those layers (see ``_by_layer``): fractions
    would round a layer onto a device that is already full.
    """
    n_layer = max(target.n_layer, 1)
    per_layer = max((min(target.layer_bytes, memory.weights) + memory.kv) / n_layer, 1.0)
    total_room = sum(max(r, 0) for r in rooms) or 1
    quotas = [n_layer * max(r, 0) / total_room for r in rooms]
    caps = [int(max(r, 0) // per_layer) for r in rooms]
    counts = [min(int(q), c) for q, c in zip(quotas, caps, strict=True)]
    while sum(counts) < n_layer:
        spare = [i for i in range(holder + 1) if counts[i] < caps[i]] or list(range(holder + 1))
        counts[max(spare, key=lambda i: quotas[i] - counts[i])] += 1
    counts[holder] += 1
    return tuple(float(c) for c in counts)


def _by_layer(shares: tuple[float, ...], memory: MemoryBytes, target: ModelFacts) -> list[int]:
    """Each device's weights and KV as the engine places them with every layer offloaded.

    llama_model::load_tensors (src/llama-model.cpp of the pinned source) splits n_layer + 1
    slots by the cumulative --tensor-split: layer ``il`` goes to the first device whose
    cumulative share exceeds ``il / (n_layer + 1)``, and the output layer (the last slot) to
    the device of slot ``n_layer``, so the last device also holds the output matrix.
    """
    n_layer = max(target.n_layer, 1)
    whole = sum(shares) or 1.0
    bounds, running = [], 0.0
    for share in shares:
        running += share
        bounds.append(running / whole)

    def device_of(slot: int) -> int:
        above = (i for i, bound in enumerate(bounds) if bound > slot / (n_layer + 1))
        return next(above, len(shares) - 1)

    layers = [0] * len(shares)
    for il in range(n_layer):
        layers[device_of(il)] += 1
    layer_weights = min(target.layer_bytes, memory.weights)
    parts = [
        (layer_weights * n + memory.kv * n) // n_layer + int(memory.draft * share / whole)
        for n, share in zip(layers, shares, strict=True)
    ]
    parts[device_of(n_layer)] += memory.weights - layer_weights
    return parts
