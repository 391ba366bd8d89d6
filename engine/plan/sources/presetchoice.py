"""Which preset a machine gets: every shipped preset planned for one budget by the one
planner, and the choice `lucebox up` makes from them."""

from __future__ import annotations

from dataclasses import dataclass, replace

from lucebox.engine.core.errors import GuardRefusal
from lucebox.engine.core.paths import Paths
from lucebox.engine.core.units import GIB
from lucebox.engine.machine.budget import GpuBudget
from lucebox.engine.models.presets import (
    LUCEBOX_PRESET_ENGINE,
    Preset,
    find_preset,
    load_presets,
)
from lucebox.engine.plan.engineview import Installs
from lucebox.engine.plan.launchplan import LaunchPlan
from lucebox.engine.plan.modelfiles import preset_vision
from lucebox.engine.plan.options import Resolved, ServeOptions
from lucebox.engine.plan.planner import plan_launch

GOOD_CTX = 8192
"""The least context a set needs to be offered as a card's pick."""


@dataclass(frozen=True)
class PresetTable:
    """Every preset planned for one budget, and the one `lucebox up` would pick."""

    budget: GpuBudget
    plans: tuple[LaunchPlan, ...]
    best: LaunchPlan | None


def choose_preset(plans: list[LaunchPlan], budget: GpuBudget) -> LaunchPlan | None:
    """The best model set that fits: the largest tier the card is made for, within it a set the
    Lucebox engine serves (DDTree on its draft) with the largest reported gain, then the most
    context. A set made for that
    engine is offered only where the planner serves it there: elsewhere (no NVIDIA GPU, off
    loopback) its draft is unusable and the tier's llama-server set is the better pick.
    Without a GPU it is the CPU default: larger models on a CPU are too slow to enjoy.
    """
    card_gib = round(budget.vram_total_bytes / GIB)
    useful = [
        p
        for p in plans
        if budget.is_gpu
        and p.preset is not None
        and not p.misfit
        and not p.preset.smoke_test
        and p.preset.vram_tier_gib <= card_gib
        and p.plan.ctx >= min(GOOD_CTX, p.target.facts.native_ctx)
        and (p.preset.engine != LUCEBOX_PRESET_ENGINE or _verifies_draft_trees(p))
    ]
    if useful:
        return max(
            useful,
            key=lambda p: (
                p.preset.vram_tier_gib if p.preset else 0,
                _verifies_draft_trees(p),
                _reported_speedup(p) if _verifies_draft_trees(p) else 0.0,
                p.plan.ctx,
            ),
        )
    # No GPU worth using: the small instruct model made for CPUs, else the smoke test.
    fallback = [
        p
        for p in plans
        if p.plan.fits
        and p.refusal is None
        and p.preset
        and (p.preset.cpu_default or p.preset.smoke_test)
    ]
    return min(fallback, key=lambda p: not (p.preset and p.preset.cpu_default), default=None)


def _verifies_draft_trees(plan: LaunchPlan) -> bool:
    return plan.served_by.verifies_draft_trees


def _reported_speedup(plan: LaunchPlan) -> float:
    draft = plan.preset.draft if plan.preset else None
    return (draft.reported_speedup if draft else None) or 1.0


def plan_preset(
    paths: Paths,
    options: ServeOptions,
    resolved: Resolved,
    budget: GpuBudget,
    installs: Installs,
    preset: Preset,
) -> LaunchPlan:
    """The launch `plan --preset ID` (and `up --preset ID --dry-run`) plans for ``preset``:
    the same options, projectors, engine and KV mode. A refusal `up` raises before planning
    (--vision on and the file here is not the preset's projector) is the plan's refusal."""
    options = replace(options, preset=preset.id, model=None, models=(), quant=None)
    resolved = replace(resolved, preset_id=preset.id)
    vision = preset_vision(paths, preset, resolved)
    launch = plan_launch(
        paths,
        options,
        resolved=resolved,
        budget=budget,
        installs=installs,
        preset=preset,
        projectors=vision.projectors,
    )
    if vision.refusal is not None:
        left_out = launch.with_vision_left_out(f"refused: {vision.refusal.message}")
        return replace(left_out, refusal=vision.refusal)
    return launch.with_vision_left_out(vision.unplanned)


def preset_table(
    paths: Paths, options: ServeOptions, resolved: Resolved, budget: GpuBudget, installs: Installs
) -> PresetTable:
    """Every preset planned for ``budget`` as `plan --preset ID` plans it, and the one a card
    of that size gets."""
    plans = tuple(
        plan_preset(paths, options, resolved, budget, installs, p) for p in load_presets(paths)
    )
    return PresetTable(budget, plans, choose_preset(list(plans), budget))


def pick_preset(
    paths: Paths, options: ServeOptions, resolved: Resolved, budget: GpuBudget, installs: Installs
) -> Preset:
    """The named preset, or the best one for ``budget``; refuses when none fits."""
    if resolved.preset_id:
        return find_preset(paths, resolved.preset_id)
    table = preset_table(paths, options, resolved, budget, installs)
    best = table.best if not resolved.preset_among else _best_among(table, resolved.preset_among)
    if best is None or best.preset is None:
        among = ", ".join(resolved.preset_among)
        raise GuardRefusal(
            f"none of {among} fits {budget.device}" if among else f"no preset fits {budget.device}",
            hint="see `lucebox presets` for what each needs, or pass --model",
        )
    return best.preset


def _best_among(table: PresetTable, ids: tuple[str, ...]) -> LaunchPlan | None:
    """The one of ``ids`` `up` would pick for the card; where the card is below them all (or
    no GPU), the smallest that fits: the user named these."""
    named = [p for p in table.plans if p.preset is not None and p.preset.id in ids]
    fitting = [p for p in named if not p.misfit]
    return choose_preset(named, table.budget) or min(
        fitting, key=lambda p: p.preset.vram_tier_gib if p.preset else 0, default=None
    )
