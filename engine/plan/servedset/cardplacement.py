"""A set over several GPUs: each model alone on a card where one holds it (the other cards
serve the set's other models), else the set planned over all cards."""

from __future__ import annotations

from lucebox.engine.core.paths import Paths
from lucebox.engine.machine.budget import DeviceBudget, GpuBudget, pool_of
from lucebox.engine.machine.config import Settings
from lucebox.engine.plan.engineview import Installs
from lucebox.engine.plan.launchplan import LaunchPlan
from lucebox.engine.plan.options import ServeOptions
from lucebox.engine.plan.servedset.setplan import Member, SetPlan, checked_set, with_reason
from lucebox.engine.plan.servedset.setshare import fit_group, fixed_bytes, plan_member, refuse_alone


def plan_on_cards(
    paths: Paths,
    options: ServeOptions,
    members: tuple[Member, ...],
    settings: Settings,
    budget: GpuBudget,
    installs: Installs,
    cards: tuple[DeviceBudget, ...],
) -> SetPlan:
    """Each model on a card of its own where one holds it; else the set over all cards."""
    host = budget.host_total_bytes
    on_card = {
        m.source: {c.index: plan_member(paths, options, m, settings, pool_of((c,), host), installs)
                   for c in cards}
        for m in members
    }  # fmt: skip
    if not all(any(_holds_alone(lp) for lp in on_card[m.source].values()) for m in members):
        pooled = tuple(plan_member(paths, options, m, settings, budget, installs) for m in members)
        refusal = refuse_alone(budget, pooled)
        if refusal is not None:
            return SetPlan(pooled, 1, budget, {"fits": refusal.message}, refusal)
        wide = next(
            m.source
            for m in members
            if not any(_holds_alone(lp) for lp in on_card[m.source].values())
        )
        group = fit_group(
            paths, options, members, pooled, settings=settings, budget=budget, installs=installs
        )
        why = f"{wide} fits no card alone: the set shares all {len(cards)} cards"
        launches = tuple(with_reason(lp, "device", why) for lp in group.launches)
        return checked_set(launches, group.fit_together, budget, {"models_max": group.why})

    placed = _assign_cards(members, on_card, cards)
    by_source: dict[str, LaunchPlan] = {}
    reasons: dict[str, str] = {}
    limits: list[int] = []
    for card in cards:
        group_members = tuple(placed[card.index])
        if not group_members:
            continue
        alone = tuple(on_card[m.source][card.index] for m in group_members)
        group = fit_group(
            paths, options, group_members, alone, settings=settings,
            budget=pool_of((card,), host), installs=installs,
        )  # fmt: skip
        others = [
            lp.alias
            for c in cards
            if c.index != card.index
            for lp in (on_card[m.source][c.index] for m in placed[c.index])
        ]
        for member, launch in zip(group_members, group.launches, strict=True):
            mates = [lp.alias for lp in group.launches if lp is not launch]
            where = f"shares {card.label} with {', '.join(mates)}" if mates else f"on {card.label}"
            why = f"{where}; no split: the other cards serve {', '.join(others) or 'nothing'}"
            by_source[member.source] = with_reason(launch, "split", why)
        reasons[card.label] = group.why
        if group.fit_together < len(group_members):
            limits.append(group.fit_together)
    models_max = min(limits) if limits else len(members)
    reasons["models_max"] = (
        f"{models_max} on the tightest card; lucebox's proxy evicts per card by memory, "
        "so the other cards keep their models loaded (a count limit would not)"
        if limits
        else f"{models_max}: every card holds all of its models at once"
    )
    launches = tuple(by_source[m.source] for m in members)
    return checked_set(launches, models_max, budget, reasons)


def _holds_alone(launch: LaunchPlan) -> bool:
    """The launch serves wholly on its device: not refused, every layer and expert on it."""
    p = launch.plan
    return launch.refusal is None and p.n_gpu_layers < 0 and not p.n_cpu_moe


def _assign_cards(
    members: tuple[Member, ...],
    on_card: dict[str, dict[int, LaunchPlan]],
    cards: tuple[DeviceBudget, ...],
) -> dict[int, list[Member]]:
    """The models on each card: largest first, each to the card with the most room left that
    holds it alone."""
    room = {c.index: c.vram_free_bytes for c in cards}
    placed: dict[int, list[Member]] = {c.index: [] for c in cards}
    for member in sorted(members, key=lambda m: -max(map(fixed_bytes, on_card[m.source].values()))):
        fitting = [i for i, lp in on_card[member.source].items() if _holds_alone(lp)]
        index = max(fitting, key=lambda i: room[i] - fixed_bytes(on_card[member.source][i]))
        placed[index].append(member)
        room[index] -= fixed_bytes(on_card[member.source][index])
    return placed
