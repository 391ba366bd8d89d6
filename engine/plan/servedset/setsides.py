"""Embedding and reranker models beside a served set: planned (:mod:`sidemodels`) in what the
set leaves on the device of its first model, once the set's own models are planned.

The set keeps every byte it planned: as many models loaded at once as before, each with its
context. The side models take what is left after the largest ``models_max`` of the models
on that device and a reserve; one that does not fit refuses the set with the numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

from lucebox.engine.core.paths import Paths
from lucebox.engine.machine.budget import GpuBudget
from lucebox.engine.plan.launch import private_port
from lucebox.engine.plan.launchplan import LaunchPlan
from lucebox.engine.plan.sidemodels import SideHost, SidePlan, SideRole, plan_sides, read_side_file
from lucebox.engine.plan.sideplan import side_path


def device_key(launch: LaunchPlan) -> str:
    """The device a model's memory is counted on: its GPUs (NVML indices), or the RAM."""
    return ",".join(map(str, launch.server.gpus)) or "ram"


def device_room_bytes(budget: GpuBudget, key: str) -> int:
    """What the set's budget has on device ``key`` (:func:`device_key`)."""
    if key == "ram":
        return budget.vram_free_bytes
    free = {str(d.index): d.vram_free_bytes for d in budget.devices}
    return sum(free[i] for i in key.split(","))


def side_headroom_bytes(
    launches: Sequence[LaunchPlan], budget: GpuBudget, models_max: int, process_bytes: int, key: str
) -> int:
    """What a set of ``launches`` leaves on ``key``: its room less the ``models_max`` largest
    models there (each with its process) and the largest reserve one of them keeps."""
    on_key = [lp for lp in launches if device_key(lp) == key]
    sizes = sorted((lp.plan.memory_bytes.total + process_bytes for lp in on_key), reverse=True)
    reserve = max((lp.plan.memory_bytes.reserve for lp in on_key), default=0)
    return device_room_bytes(budget, key) - sum(sizes[:models_max]) - reserve


def set_sides(
    paths: Paths,
    launches: Sequence[LaunchPlan],
    budget: GpuBudget,
    limits: tuple[int, int],
    side_models: tuple[tuple[SideRole, str], ...],
) -> SidePlan:
    """The side models ``side_models`` names beside a set of ``launches``, on its first
    model's device; ``limits``: the set's (models_max, process_bytes)."""
    files = tuple(
        read_side_file(role, source, side_path(paths, role, source)) for role, source in side_models
    )
    first = launches[0]
    key = device_key(first)
    host = SideHost(
        server_path=first.installs.llama_server.server_path,
        api_key_file=first.server.api_key_file,
        on_gpu=key != "ram",
        gpus=key.split(",")[0] if key != "ram" else "",
        engine_port=private_port(first.resolved.port),
    )
    headroom = side_headroom_bytes(launches, budget, *limits, key)
    return plan_sides(files, headroom_bytes=headroom, host=host, left_by="the set's plan")
