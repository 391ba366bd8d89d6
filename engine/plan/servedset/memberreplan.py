"""One model of a running set planned again (out of memory, or the speculation guard's
decision) on the same share, while the other models keep their plans and keep running."""

from __future__ import annotations

from dataclasses import replace

from lucebox.engine.core.paths import Paths
from lucebox.engine.core.units import MIB
from lucebox.engine.machine.config import Settings
from lucebox.engine.plan.launchplan import LaunchPlan
from lucebox.engine.plan.planner import replan, smaller_context_plan
from lucebox.engine.plan.servedset.setplan import SET_REASONS, SetPlan, with_reason
from lucebox.engine.plan.speculation.specguard import Decision


def smaller_context_set(paths: Paths, planned: SetPlan, alias: str, settings: Settings) -> SetPlan:
    """``planned`` with ``alias`` planned again after its process ran out of memory: three
    quarters of its context on the same share, as one served model (``smaller_context_plan``);
    the other models keep their plans, so the router keeps them running.

    Raises:
        GuardRefusal: its context was asked for (never shrunk), or the smaller plan does not fit.
    """
    launch = planned.launches[planned.aliases.index(alias)]
    smaller = smaller_context_plan(paths, launch, _member_settings(launch, settings))
    why = f"ran out of memory at {launch.plan.ctx} tokens: planned again at {smaller.plan.ctx}"
    return _with_member(planned, alias, smaller, why)


def respecced_set(
    paths: Paths, planned: SetPlan, alias: str, settings: Settings, decision: Decision
) -> SetPlan:
    """``planned`` with ``alias`` planned again after the speculation guard's ``decision``:
    shorter drafts or none, on the same share, as one served model (``replan``); the other
    models keep their plans, so the router keeps them running.

    Raises:
        GuardRefusal: the re-plan does not fit (the same files on the same share).
    """
    launch = planned.launches[planned.aliases.index(alias)]
    same = _member_settings(launch, settings)
    if decision.action == "shorten":
        changed = replan(paths, launch, same, draft_max=decision.draft_max)
    else:
        changed = replan(paths, launch, same, spec="off")
    return _with_member(planned, alias, changed, decision.reason)


def _member_settings(launch: LaunchPlan, settings: Settings) -> Settings:
    """The settings a member is planned again with: plan_set may have changed what the PC
    keeps (a RAM limit), and the re-plan keeps the same."""
    return replace(settings, keep_free_ram_mib=(launch.resolved.keep_free_ram_bytes or 0) // MIB)


def _with_member(planned: SetPlan, alias: str, changed: LaunchPlan, why: str) -> SetPlan:
    """``planned`` with ``alias``'s launch replaced by ``changed`` (its set reasons kept).

    Raises:
        GuardRefusal: ``changed`` was refused.
    """
    if changed.refusal is not None:
        raise changed.refusal
    index = planned.aliases.index(alias)
    before = planned.launches[index]
    for key in SET_REASONS:
        if key in before.plan.reasons:
            changed = with_reason(changed, key, before.plan.reasons[key])
    launches = (*planned.launches[:index], changed, *planned.launches[index + 1 :])
    return replace(planned, launches=launches, reasons={**planned.reasons, alias: why})
