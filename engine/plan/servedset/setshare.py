"""Models that share one device: each planned again on an equal share of what the largest fixed
costs leave, so that any ``k`` of them fit together; the largest ``k`` that still gives every
model the context it wants wins."""

from __future__ import annotations

from dataclasses import dataclass, replace

from lucebox.engine.core.errors import GuardRefusal
from lucebox.engine.core.paths import Paths
from lucebox.engine.core.units import GIB
from lucebox.engine.machine.budget import GpuBudget
from lucebox.engine.machine.config import Settings
from lucebox.engine.plan.engineview import Installs
from lucebox.engine.plan.launchplan import LaunchPlan
from lucebox.engine.plan.memory.ctxchoice import wanted_ctx
from lucebox.engine.plan.options import ServeOptions, resolve
from lucebox.engine.plan.planner import plan_launch
from lucebox.engine.plan.servedset.setplan import Member


def plan_member(
    paths: Paths,
    options: ServeOptions,
    member: Member,
    settings: Settings,
    budget: GpuBudget,
    installs: Installs,
) -> LaunchPlan:
    """``member`` planned alone on ``budget`` by the one planner."""
    one = replace(
        options,
        preset=member.preset.id if member.preset else None,
        model=None if member.preset else member.source,
        models=(),
    )
    resolved = resolve(one, settings)
    return plan_launch(
        paths, one, resolved=resolved, budget=budget, installs=installs, preset=member.preset
    )


def fixed_bytes(launch: LaunchPlan, process_bytes: int = 0) -> int:
    """What a model costs whatever its context: everything but its KV cache, and its process."""
    memory = launch.plan.memory_bytes
    return memory.total - memory.kv + process_bytes


def shared_ctx(launch: LaunchPlan) -> int:
    """The context a model should keep when it shares: the one asked for, else an agent's."""
    return wanted_ctx(launch.resolved.ctx, launch.target.facts.native_ctx)


def share_of(budget: GpuBudget, room_bytes: int, k: int) -> GpuBudget:
    """``budget`` cut to ``room_bytes`` (each device in proportion), host RAM to 1/``k``."""
    if not budget.is_gpu:
        return replace(budget, vram_total_bytes=room_bytes, vram_free_bytes=room_bytes)
    scale = room_bytes / budget.vram_free_bytes if budget.vram_free_bytes else 0.0
    devices = tuple(
        replace(d, vram_free_bytes=int(d.vram_free_bytes * scale)) for d in budget.devices
    )
    return replace(
        budget,
        vram_free_bytes=sum(d.vram_free_bytes for d in devices) if devices else room_bytes,
        host_total_bytes=budget.host_total_bytes // k,
        devices=devices,
    )


@dataclass(frozen=True)
class Group:
    """Models that share one device (or one pool of devices): their plans and how many fit."""

    launches: tuple[LaunchPlan, ...]
    fit_together: int
    why: str


def fit_group(
    paths: Paths,
    options: ServeOptions,
    members: tuple[Member, ...],
    alone: tuple[LaunchPlan, ...],
    *,
    settings: Settings,
    budget: GpuBudget,
    installs: Installs,
    process_bytes: int = 0,
) -> Group:
    """The most of ``members`` that fit on ``budget`` at once with the context they want;
    ``alone`` are their plans on ``budget`` less one process."""
    free = budget.vram_free_bytes
    fixed = [fixed_bytes(launch, process_bytes) for launch in alone]
    wants = [_wanted_when_sharing(launch) for launch in alone]
    where = budget.device
    passed = ""
    for k in range(len(members), 1, -1):
        spare = free - sum(sorted(fixed, reverse=True)[:k])
        if spare <= 0:
            passed = passed or f"{k} at once do not fit: their weights alone exceed {where}"
            continue
        launches = tuple(
            plan_member(
                paths, options, m, settings,
                share_of(budget, f + spare // k - process_bytes, k), installs,
            )
            for m, f in zip(members, fixed, strict=True)
        )  # fmt: skip
        short = [
            (launch, want)
            for launch, want in zip(launches, wants, strict=True)
            if launch.refusal is not None or launch.plan.ctx < want
        ]
        if not short:
            why = (
                f"any {k} of {len(members)} fit on {where} together, each with at least the "
                "context it wants (an agent's 32K, the one asked, or its native maximum)"
            )
            return Group(launches, k, "; ".join(filter(None, [why, passed])))
        first, want = short[0]
        passed = passed or (
            f"{k} at once would leave {first.alias} {first.plan.ctx} tokens (it wants {want})"
        )
    if len(members) == 1:
        return Group(alone, 1, f"alone on {where}")
    why = f"one at a time on {where}, each with its whole context"
    return Group(alone, 1, "; ".join(filter(None, [why, passed])))


def _wanted_when_sharing(alone: LaunchPlan) -> int:
    """The context a model wants beside others: its agent context, or less where its plan
    alone stops short for a reason other than memory (a CPU plan is bounded by how long the
    CPU takes to read its context)."""
    plan = alone.plan
    bounded_elsewhere = plan.largest_ctx > plan.ctx
    return min(shared_ctx(alone), plan.ctx) if bounded_elsewhere else shared_ctx(alone)


def refuse_alone(budget: GpuBudget, alone: tuple[LaunchPlan, ...]) -> GuardRefusal | None:
    """The refusal of a set one of whose models does not fit even by itself."""
    for launch in alone:
        if launch.refusal is None:
            continue
        needs = launch.plan.memory_bytes.total
        return GuardRefusal(
            f"the set cannot be served even one model at a time: {launch.alias} needs "
            f"{needs / GIB:.2f} GiB at {launch.plan.ctx} tokens and {budget.device} has "
            f"{budget.vram_free_bytes / GIB:.2f} GiB free ({launch.refusal.message})",
            hint=f"leave {launch.alias} out of the set, or pick a smaller quantization of it",
        )
    return None
