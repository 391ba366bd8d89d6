"""A served set: several models on one endpoint, planned against one budget per device.

The one planner (``plan_launch``) plans every model; this module decides where each runs and
how many may be loaded at once. Each model first gets its plan alone on a device; a set that
cannot fit even one model at a time is refused with that model's numbers. Models that share
a device are planned again on a share of it (:mod:`setshare`): with ``k`` of them loaded at
once, model ``i`` gets its fixed cost (weights, compute, CUDA context, host caches) plus an
equal part of what is left after the ``k`` largest fixed costs, so any ``k`` of them fit
together. The largest ``k`` that still gives every model the context it wants wins.
llama-server's router loads models on request; lucebox's proxy in front of it
(run/servedset/servedsetproxy.py) evicts the least recently used ones on a device until the
next one fits, by these plans' bytes.

With several GPUs each model runs alone on a card when it fits one (:mod:`cardplacement`: the
other cards serve the set's other models); a model no card holds alone has the set planned
over all cards.
"""

from __future__ import annotations

from dataclasses import replace

from lucebox.engine.core.errors import UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.core.units import MIB
from lucebox.engine.machine.budget import GpuBudget
from lucebox.engine.machine.config import Settings
from lucebox.engine.plan.engineview import Installs
from lucebox.engine.plan.launchplan import LaunchPlan
from lucebox.engine.plan.memory.sizes import RESERVE_MIN_BYTES
from lucebox.engine.plan.options import ServeOptions, side_models_of
from lucebox.engine.plan.servedset.cardplacement import plan_on_cards
from lucebox.engine.plan.servedset.setplan import SetPlan, checked_set, members_of, with_reason
from lucebox.engine.plan.servedset.setshare import fit_group, plan_member, refuse_alone, share_of
from lucebox.engine.plan.servedset.setsides import set_sides

ENGINE_PROCESS_BYTES = 40 * MIB
"""Without a GPU, what each engine process of a set holds beyond the plan's terms (code,
threads, HTTP server): the CPU engine serving a generated 0.2 MB llama held 35.5 MiB RSS.
The router's own process is counted once more. On a GPU the CUDA context is counted instead."""


def plan_set(
    paths: Paths,
    options: ServeOptions,
    sources: tuple[str, ...],
    *,
    settings: Settings,
    budget: GpuBudget,
    installs: Installs,
    ram_limit_bytes: int = 0,
) -> SetPlan:
    """The set ``sources`` on ``budget``; ``ram_limit_bytes`` (0: none) caps a CPU budget.
    Its side models are planned once, beside the set (:mod:`setsides`), never by a member."""
    side_models = side_models_of(options, settings)
    options = replace(options, embed_model=None, rerank_model=None)
    settings = replace(settings, embed_model="", rerank_model="")
    planned = _members_planned(paths, options, sources, settings, budget, installs, ram_limit_bytes)
    if not side_models:
        return planned
    limits = (planned.models_max, planned.process_bytes)
    sides = set_sides(paths, planned.launches, planned.budget, limits, side_models)
    return replace(planned, sides=sides, refusal=planned.refusal or sides.refusal)


def _members_planned(
    paths: Paths,
    options: ServeOptions,
    sources: tuple[str, ...],
    settings: Settings,
    budget: GpuBudget,
    installs: Installs,
    ram_limit_bytes: int,
) -> SetPlan:
    """The set's own models.

    A projector is planned in the set's budget like the rest of its model; under
    ``--vision auto`` the set keeps it only where the set still holds as many models at once
    as it would without (the set's counterpart of the context a projector must not cost)."""
    planned = _plan_set(paths, options, sources, settings, budget, installs, ram_limit_bytes)
    auto = [lp for lp in planned.launches if lp.vision.served and lp.resolved.vision == "auto"]
    if not auto:
        return planned
    text_only = replace(options, vision="off")
    without = _plan_set(paths, text_only, sources, settings, budget, installs, ram_limit_bytes)
    if not without.fits or without.models_max <= planned.models_max:
        return planned
    dropped = {lp.alias: lp.vision for lp in auto}
    cost = (
        f"in this set it would hold {planned.models_max} model(s) at once instead of "
        f"{without.models_max}"
    )

    def told(launch: LaunchPlan) -> LaunchPlan:
        vision = dropped.get(launch.alias)
        if vision is None:
            return launch
        assert vision.projector is not None
        why = f"not served: {vision.projector.path.name} {cost}; pass --vision on to serve it"
        shown = with_reason(launch, "vision", why)
        return replace(shown, vision=replace(vision, served=False, reason=why))

    return replace(without, launches=tuple(told(lp) for lp in without.launches))


def _plan_set(
    paths: Paths,
    options: ServeOptions,
    sources: tuple[str, ...],
    settings: Settings,
    budget: GpuBudget,
    installs: Installs,
    ram_limit_bytes: int,
) -> SetPlan:
    if options.draft is not None:
        raise UsageError(
            "--draft names the draft of one model, and a set has several",
            hint="serve the set without --draft (presets in a set keep their own drafts)",
        )
    members = members_of(paths, sources)
    if ram_limit_bytes and not budget.is_gpu and ram_limit_bytes < budget.vram_free_bytes:
        budget = replace(budget, vram_total_bytes=ram_limit_bytes, vram_free_bytes=ram_limit_bytes)
        budget = replace(budget, device=f"{budget.device}, {ram_limit_bytes // MIB} MiB for models")
        # The limit is what the models get: the rest of the PC's share lies outside it.
        settings = replace(settings, keep_free_ram_mib=RESERVE_MIN_BYTES // MIB)
    cards = budget.devices if budget.is_gpu and not any(d.address for d in budget.devices) else ()
    if len(cards) > 1:
        return plan_on_cards(paths, options, members, settings, budget, installs, cards)
    process = 0 if budget.is_gpu else ENGINE_PROCESS_BYTES
    if process:
        # The router's process first, then each model's: the plans get what is left.
        budget = share_of(budget, budget.vram_free_bytes - process, 1)
    alone_budget = share_of(budget, budget.vram_free_bytes - process, 1) if process else budget
    alone = tuple(plan_member(paths, options, m, settings, alone_budget, installs) for m in members)
    refusal = refuse_alone(budget, alone)
    if refusal is not None:
        return SetPlan(alone, 1, budget, {"fits": refusal.message}, refusal, process)
    group = fit_group(
        paths, options, members, alone, settings=settings, budget=budget, installs=installs,
        process_bytes=process,
    )  # fmt: skip
    launches = tuple(with_reason(lp, "device", f"on {budget.device}") for lp in group.launches)
    reasons = {"models_max": group.why}
    if process:
        reasons["process"] = (
            f"{process // MIB} MiB per engine process (the router's and each model's) beyond "
            "the plans, measured on the CPU engine"
        )
    planned = checked_set(launches, group.fit_together, budget, reasons)
    return replace(planned, process_bytes=process)
