"""A served set: several models on one endpoint, planned against one budget per device.

The one planner (``plan_launch``) plans every model; this module decides where each runs and
how many may be loaded at once. Each model first gets its plan alone on a device; a set that
cannot fit even one model at a time is refused with that model's numbers. Models that share
a device are planned again on a share of it: with ``k`` of them loaded at once, model ``i``
gets its fixed cost (weights, compute, CUDA context, host caches) plus an equal part of what
is left after the ``k`` largest fixed costs, so any ``k`` of them fit together. The largest
``k`` that still gives every model the context it wants wins. llama-server's router loads
models on request; lucebox's proxy in front of it (run/servedset/servedsetproxy.py) evicts the least
recently used ones on a device until the next one fits, by these plans' bytes.

With several GPUs each model runs alone on a card when it fits one (the other cards serve
the set's other models); a model no card holds alone has the set planned over all cards.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lucebox.engine.core.errors import GuardRefusal, UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.core.units import GIB, MIB
from lucebox.engine.machine.budget import DeviceBudget, GpuBudget, pool_of
from lucebox.engine.machine.config import Settings
from lucebox.engine.models.presets import Preset, load_presets
from lucebox.engine.plan.engineview import Installs
from lucebox.engine.plan.launchplan import LaunchPlan
from lucebox.engine.plan.memory.ctxchoice import wanted_ctx
from lucebox.engine.plan.memory.sizes import RESERVE_MIN_BYTES
from lucebox.engine.plan.options import ServeOptions, resolve, side_models_of
from lucebox.engine.plan.planner import plan_launch, replan, smaller_context_plan
from lucebox.engine.plan.servedset.setsides import set_sides
from lucebox.engine.plan.sidemodels import NO_SIDES, SidePlan
from lucebox.engine.plan.speculation.specguard import Decision

ENGINE_PROCESS_BYTES = 40 * MIB
"""Without a GPU, what each engine process of a set holds beyond the plan's terms (code,
threads, HTTP server): the CPU engine serving a generated 0.2 MB llama held 35.5 MiB RSS.
The router's own process is counted once more. On a GPU the CUDA context is counted instead."""


@dataclass(frozen=True)
class Member:
    """One model of the set as the user named it: a preset id or a model source."""

    source: str
    preset: Preset | None


@dataclass(frozen=True)
class SetPlan:
    """The plan of a served set: one launch plan per model and how many load at once."""

    launches: tuple[LaunchPlan, ...]
    models_max: int
    """How many models may be loaded at once; any that many fit together."""
    budget: GpuBudget
    reasons: dict[str, str]
    refusal: GuardRefusal | None = None
    process_bytes: int = 0
    """What each model's own process holds beyond its plan (and the router's, once)."""
    sides: SidePlan = NO_SIDES
    """The embedding and reranker models beside the set (:mod:`setsides`)."""

    @property
    def fits(self) -> bool:
        return self.refusal is None

    @property
    def aliases(self) -> tuple[str, ...]:
        return tuple(launch.alias for launch in self.launches)

    def to_json(self) -> dict[str, Any]:
        """The document `plan --json` prints for a set."""
        return {
            "models": [launch.to_json() for launch in self.launches],
            "models_max": self.models_max,
            "fits": self.fits,
            "reasons": dict(self.reasons),
            "device": self.budget.device,
            "process_bytes": self.process_bytes,
            "refusal": str(self.refusal) if self.refusal else None,
            **({"side_models": self.sides.to_json()} if self.sides.models else {}),
        }


class SetRefusal(GuardRefusal):
    """A set that must not start; carries its plan so `plan` can still print it."""

    def __init__(self, planned: SetPlan, refusal: GuardRefusal) -> None:
        super().__init__(refusal.message, hint=refusal.hint, problem_codes=refusal.problem_codes)
        self.planned = planned


def members_of(paths: Paths, sources: tuple[str, ...]) -> tuple[Member, ...]:
    """Each name as a preset (a preset id that is not a file here) or a model source."""
    by_id = {preset.id: preset for preset in load_presets(paths)}
    members = tuple(
        Member(s, None if Path(s).expanduser().exists() else by_id.get(s)) for s in sources
    )
    if len(set(sources)) != len(sources):
        twice = sorted({s for s in sources if sources.count(s) > 1})
        raise UsageError(f"the set names {', '.join(twice)} twice", hint="name each model once")
    return members


def _plan(
    paths: Paths,
    options: ServeOptions,
    member: Member,
    settings: Settings,
    budget: GpuBudget,
    installs: Installs,
) -> LaunchPlan:
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
class _Group:
    """Models that share one device (or one pool of devices): their plans and how many fit."""

    launches: tuple[LaunchPlan, ...]
    fit_together: int
    why: str


def _group(
    paths: Paths,
    options: ServeOptions,
    members: tuple[Member, ...],
    alone: tuple[LaunchPlan, ...],
    *,
    settings: Settings,
    budget: GpuBudget,
    installs: Installs,
    process_bytes: int = 0,
) -> _Group:
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
            _plan(
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
            return _Group(launches, k, "; ".join(filter(None, [why, passed])))
        first, want = short[0]
        passed = passed or (
            f"{k} at once would leave {first.alias} {first.plan.ctx} tokens (it wants {want})"
        )
    if len(members) == 1:
        return _Group(alone, 1, f"alone on {where}")
    why = f"one at a time on {where}, each with its whole context"
    return _Group(alone, 1, "; ".join(filter(None, [why, passed])))


def _wanted_when_sharing(alone: LaunchPlan) -> int:
    """The context a model wants beside others: its agent context, or less where its plan
    alone stops short for a reason other than memory (a CPU plan is bounded by how long the
    CPU takes to read its context)."""
    plan = alone.plan
    bounded_elsewhere = plan.largest_ctx > plan.ctx
    return min(shared_ctx(alone), plan.ctx) if bounded_elsewhere else shared_ctx(alone)


def _refuse_alone(budget: GpuBudget, alone: tuple[LaunchPlan, ...]) -> GuardRefusal | None:
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


_SET_REASONS = ("device", "split")
"""The reasons the set adds to a member's plan (where it runs); a re-plan of it keeps them."""


def _with_reason(launch: LaunchPlan, key: str, why: str) -> LaunchPlan:
    return launch.with_plan(replace(launch.plan, reasons={**launch.plan.reasons, key: why}))


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
        shown = _with_reason(launch, "vision", why)
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
        return _plan_on_cards(paths, options, members, settings, budget, installs, cards)
    process = 0 if budget.is_gpu else ENGINE_PROCESS_BYTES
    if process:
        # The router's process first, then each model's: the plans get what is left.
        budget = share_of(budget, budget.vram_free_bytes - process, 1)
    alone_budget = share_of(budget, budget.vram_free_bytes - process, 1) if process else budget
    alone = tuple(_plan(paths, options, m, settings, alone_budget, installs) for m in members)
    refusal = _refuse_alone(budget, alone)
    if refusal is not None:
        return SetPlan(alone, 1, budget, {"fits": refusal.message}, refusal, process)
    group = _group(
        paths, options, members, alone, settings=settings, budget=budget, installs=installs,
        process_bytes=process,
    )  # fmt: skip
    launches = tuple(_with_reason(lp, "device", f"on {budget.device}") for lp in group.launches)
    reasons = {"models_max": group.why}
    if process:
        reasons["process"] = (
            f"{process // MIB} MiB per engine process (the router's and each model's) beyond "
            "the plans, measured on the CPU engine"
        )
    planned = _checked(launches, group.fit_together, budget, reasons)
    return replace(planned, process_bytes=process)


def _checked(
    launches: tuple[LaunchPlan, ...], models_max: int, budget: GpuBudget, reasons: dict[str, str]
) -> SetPlan:
    aliases = [launch.alias for launch in launches]
    twice = sorted({a for a in aliases if aliases.count(a) > 1})
    if twice:
        raise UsageError(
            f"two models of the set are both called {', '.join(twice)}",
            hint="rename one of the files (the alias is the file name without .gguf)",
        )
    return SetPlan(launches, models_max, budget, reasons)


def _plan_on_cards(
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
        m.source: {c.index: _plan(paths, options, m, settings, pool_of((c,), host), installs)
                   for c in cards}
        for m in members
    }  # fmt: skip
    if not all(any(_holds_alone(lp) for lp in on_card[m.source].values()) for m in members):
        pooled = tuple(_plan(paths, options, m, settings, budget, installs) for m in members)
        refusal = _refuse_alone(budget, pooled)
        if refusal is not None:
            return SetPlan(pooled, 1, budget, {"fits": refusal.message}, refusal)
        wide = next(
            m.source
            for m in members
            if not any(_holds_alone(lp) for lp in on_card[m.source].values())
        )
        group = _group(
            paths, options, members, pooled, settings=settings, budget=budget, installs=installs
        )
        why = f"{wide} fits no card alone: the set shares all {len(cards)} cards"
        launches = tuple(_with_reason(lp, "device", why) for lp in group.launches)
        return _checked(launches, group.fit_together, budget, {"models_max": group.why})

    placed = _assign_cards(members, on_card, cards)
    by_source: dict[str, LaunchPlan] = {}
    reasons: dict[str, str] = {}
    limits: list[int] = []
    for card in cards:
        group_members = tuple(placed[card.index])
        if not group_members:
            continue
        alone = tuple(on_card[m.source][card.index] for m in group_members)
        group = _group(
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
            by_source[member.source] = _with_reason(launch, "split", why)
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
    return _checked(launches, models_max, budget, reasons)


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
    for key in _SET_REASONS:
        if key in before.plan.reasons:
            changed = _with_reason(changed, key, before.plan.reasons[key])
    launches = (*planned.launches[:index], changed, *planned.launches[index + 1 :])
    return replace(planned, launches=launches, reasons={**planned.reasons, alias: why})
