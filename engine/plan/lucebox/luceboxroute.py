"""The planner's route to the Lucebox engine: which engine, and the launch when it serves.

Called by :func:`lucebox.engine.plan.planner.plan_launch`. The decisions themselves are pure
and live in :mod:`enginechoice` (which engine) and :mod:`luceboxplan` (memory and flags).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lucebox.engine.core import prefixstore
from lucebox.engine.core.errors import GuardRefusal
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import lucebox, luceboxbuild
from lucebox.engine.engines.bsa import SLOW_FALLBACK
from lucebox.engine.engines.known import KnownSource
from lucebox.engine.engines.registry import EngineCapabilities, EngineManifest, KindName
from lucebox.engine.machine.budget import DeviceBudget, GpuBudget, pool_of
from lucebox.engine.models.checkresult import verdict_of
from lucebox.engine.models.modelsource import parse_source
from lucebox.engine.models.presets import Preset
from lucebox.engine.models.records import stored_file, stored_path
from lucebox.engine.plan.enginechoice import (
    EngineChoice,
    EngineFacts,
    choose_engine,
    is_lucebox_draft,
)
from lucebox.engine.plan.engineview import EngineView
from lucebox.engine.plan.launchplan import LaunchBasis, LaunchPlan, Speculation
from lucebox.engine.plan.lucebox import kvmodes
from lucebox.engine.plan.lucebox.diskcache import disk_cache_of
from lucebox.engine.plan.lucebox.kvmodes import KvModesPlan
from lucebox.engine.plan.lucebox.luceboxdevices import (
    PLACEMENT_TEXT,
    Candidate,
    PlacementName,
    choose_placement,
    offered,
)
from lucebox.engine.plan.lucebox.luceboxfit import build_memory
from lucebox.engine.plan.lucebox.luceboxlaunch import LuceboxFlags
from lucebox.engine.plan.lucebox.luceboxplan import (
    PREFILL_DRAFTER_BYTES,
    PREFILL_DRAFTER_SOURCE,
    LuceboxPlan,
    LuceboxRequest,
    kv_types_for,
    plan_lucebox,
)
from lucebox.engine.plan.memory.ctxchoice import MIN_CTX
from lucebox.engine.plan.memory.memory import Plan
from lucebox.engine.plan.modelfiles import ModelFile
from lucebox.engine.plan.options import Resolved
from lucebox.engine.plan.placementrates import placement_key, read_placement_rates
from lucebox.engine.plan.speculation import measurements
from lucebox.engine.plan.speculation.speculation import SpecMode

PINNED_ARCHS = ("qwen35", "qwen35moe", "laguna", "qwen3", "gemma4", "deepseek4")
"""What the pinned engine's backend factory dispatches on (read from its source)."""
FOREIGN_DRAFT_CODES = ("draft-arch-mismatch", "draft-only", "unsupported-arch")
"""llama-server's refusals of a Lucebox draft, which do not apply when this engine serves."""


def choose(
    resolved: Resolved,
    target: ModelFile,
    draft: ModelFile | None,
    budget: GpuBudget,
    llama_plan: Plan | None,
    preset: Preset | None = None,
    *,
    measured: tuple[KindName, str] | None = None,
    missing_build: KindName | None = None,
) -> EngineChoice:
    """The engine for this launch, from what the planner has read; ``llama_plan`` is
    llama-server's plan for the context asked for (None when none was asked for);
    ``measured`` the calibration's verdict for it, ``missing_build`` the engine not built."""
    info = target.info
    # A preset's file not pulled yet: its own MTP head is what its speculation names.
    preset_mtp = bool(preset and preset.draft and preset.draft.spec_type == "draft-mtp")
    asked = resolved.ctx
    return choose_engine(
        EngineFacts(
            mode=resolved.engine_mode,
            mode_from=resolved.engine_from,
            target_arch=target.facts.architecture,
            target_has_mtp=info.has_mtp_layers if info is not None else preset_mtp,
            on_nvidia_gpu=budget.is_gpu,
            draft_name=draft.path.name if draft is not None else None,
            # A preset's draft not pulled yet: its published facts name the architecture.
            draft_arch=_draft_arch(draft),
            llama_fits_ctx=llama_plan is None
            or asked is None
            or (llama_plan.fits and llama_plan.ctx >= asked),
            ctx_asked=asked,
            vision_on=resolved.vision == "on",
            kv_mode=resolved.kv_mode,
            measured=measured,
            missing_build=missing_build,
        )
    )


def _kv_types(engine: EngineView, pinned: str | None) -> tuple[str, ...]:
    """The cache types the plan may choose from: the build's, or the one a trial pins (when
    the build has it)."""
    built = engine.capabilities.kv_cache_types or luceboxbuild.SYMMETRIC_KV_TYPES
    return (pinned,) if pinned in built else tuple(built)


def lucebox_view(installed: EngineManifest | None) -> EngineView:
    """The Lucebox build a plan is made for: the installed one, or the pinned one not built
    yet."""
    if installed is not None:
        return EngineView.of(installed)
    caps = EngineCapabilities(
        spec_types=("dflash", "ddtree"),
        kv_cache_types=luceboxbuild.SYMMETRIC_KV_TYPES,
        model_archs=PINNED_ARCHS,
        features=unbuilt_features(),
    )
    version = f"luce-dflash {lucebox.PIN.short} ({lucebox.PIN.date}), not built yet"
    return EngineView(None, version, luceboxbuild.SERVER, caps)


FIRST_SOURCE_FEATURES = (
    "prefill-compression", "draft-device", "kvflash", "sampled-verify", "symmetric-kv-only",
)  # fmt: skip
"""What the oldest known source's build reads as (its --help and binary, on the H100)."""


def unbuilt_features() -> tuple[str, ...]:
    """The features the default source's build will have, for a plan made before it is
    built: the oldest source's, with the plan-relevant flags each later known source up to
    the default adds or removes (the table's data; only a build gives its --help)."""
    return features_through(lucebox.SOURCES.sources, lucebox.SOURCES.default)


def features_through(
    sources: Sequence[KnownSource[Any]], default: KnownSource[Any]
) -> tuple[str, ...]:
    """The oldest source's features with each later source's changes up to ``default``
    (the hidden switches and symmetric KV carry forward unchanged: no source changed them)."""
    features = list(FIRST_SOURCE_FEATURES)
    for known in sources[1 : sources.index(default) + 1]:
        for change in known.flag_changes:
            if change.old in luceboxbuild.FEATURE_FLAGS:
                features.remove(change.old.removeprefix("--"))
            if change.new in luceboxbuild.FEATURE_FLAGS:
                features.append(change.new.removeprefix("--"))
    return tuple(features)


@dataclass(frozen=True)
class PrefillDrafter:
    """PFlash's drafter: where it is, or where the store will keep it once ``serve`` pulls
    it (a plan made first counts its published size, as the launch after the pull would)."""

    path: Path
    present: bool
    size_bytes: int


def _prefill_drafter(paths: Paths) -> PrefillDrafter:
    source = parse_source(PREFILL_DRAFTER_SOURCE)
    found = stored_file(paths, source)
    if found is not None:
        return PrefillDrafter(found, True, found.stat().st_size)
    planned = stored_path(paths, source)
    return PrefillDrafter(planned, False, PREFILL_DRAFTER_BYTES)


def _prefill_notes(drafter: PrefillDrafter, engine: EngineView) -> str:
    """Whether the drafter is here, and whether PFlash has its fast kernel in this build."""
    notes = ""
    if not drafter.present:
        notes += (
            f". Its drafter is not on disk yet: serve pulls {PREFILL_DRAFTER_SOURCE} first "
            f"(about {PREFILL_DRAFTER_BYTES / 1e9:.1f} GB)"
        )
    if engine.id is None:
        return notes + (
            ". PFlash gets its fast kernel (Block-Sparse-Attention) when the build has it: "
            "sm_80 or newer with its source fetched"
        )
    # The rule behind both notes: benchmarks/results/h200x2-long-prompt-modes-gpu-pflash.json.
    if not engine.bsa:
        return notes + (
            f". {SLOW_FALLBACK} in {engine.id}: scoring a long prompt then takes most of the "
            "wait for its first token, several times longer than with the fast kernel"
        )
    return notes + (
        f". {engine.id} has PFlash's fast kernel (Block-Sparse-Attention): scoring a long "
        "prompt takes a small part of the time reading it whole would"
    )


def _draft_arch(draft: ModelFile | None) -> str | None:
    """The draft's architecture: its header's, or a preset's published facts before a pull."""
    if draft is None:
        return None
    return draft.info.architecture if draft.info is not None else draft.facts.architecture


def _as_lucebox_draft(draft: ModelFile) -> ModelFile:
    """The draft with llama-server's refusals of a Lucebox draft left out."""
    if draft.check is None:
        return draft
    kept = tuple(p for p in draft.check.problems if p.code not in FOREIGN_DRAFT_CODES)
    check = dataclasses.replace(draft.check, problems=kept, verdict=verdict_of(list(kept)))
    return dataclasses.replace(draft, check=check)


def lucebox_launch(
    paths: Paths,
    basis: LaunchBasis,
    draft: ModelFile | None,
    budget: GpuBudget,
    choice: EngineChoice,
    engine: EngineView,
) -> LaunchPlan:
    """The whole launch when the Lucebox engine serves, on its build ``engine``."""
    resolved = basis.resolved
    given = draft
    foreign = given is not None and not is_lucebox_draft(_draft_arch(given))
    kept = given if given is not None and not foreign and resolved.spec != "off" else None
    draft = _as_lucebox_draft(kept) if kept is not None else None
    drafter = _prefill_drafter(paths) if resolved.prefill != "off" else None
    request = _lucebox_request(basis, draft, budget, engine, drafter)
    placed = _place(paths, request, basis.target, draft, engine, resolved)
    spec = _ddtree_speculation(draft, placed.planned.flags, resolved.spec)
    if given is not None and foreign and resolved.spec != "off":
        spec = dataclasses.replace(spec, reason=_foreign_draft_reason(given.path.name))
    plan = _explained(placed, choice, spec, drafter, engine)
    disk = disk_cache_of(
        paths, str(basis.target.path), prefixstore.build_of(engine.server_path), plan,
        wanted=resolved.cache == "agent",
    )  # fmt: skip
    plan = dataclasses.replace(plan, reasons={**plan.reasons, "disk_cache": disk.reason})
    server = dataclasses.replace(
        basis.server(paths, engine, plan, placed.budget, spec),
        kind="lucebox",
        lucebox=dataclasses.replace(placed.planned.flags, disk_cache=disk),
    )
    refusal = _refusal(choice, basis.target, draft, plan) or _placement_refusal(
        resolved.placement, placed
    )
    launch = basis.launch(server, spec, budget=placed.budget, refusal=refusal, engine_choice=choice)
    return dataclasses.replace(launch, kv_modes=_kv_modes(paths, request, launch))


def _lucebox_request(
    basis: LaunchBasis,
    draft: ModelFile | None,
    budget: GpuBudget,
    engine: EngineView,
    drafter: PrefillDrafter | None,
) -> LuceboxRequest:
    """What the Lucebox memory plan is asked, before a placement names its cards."""
    resolved = basis.resolved
    return LuceboxRequest(
        target=basis.target.facts,
        budget=budget,
        draft=draft.facts if draft is not None else None,
        ctx=resolved.ctx,
        ctx_cap=basis.ctx_cap,
        kv_types=_kv_types(engine, resolved.kv_type),
        prefill=resolved.prefill,
        prefill_drafter=str(drafter.path) if drafter else None,
        prefill_drafter_bytes=drafter.size_bytes if drafter else PREFILL_DRAFTER_BYTES,
        kv_mode=resolved.kv_mode,
        build=build_memory(engine.version),
    )


def _ddtree_speculation(
    draft: ModelFile | None, flags: LuceboxFlags, mode: SpecMode
) -> Speculation:
    """A Lucebox draft is always verified as a tree (DDTree); no draft, no speculation."""
    if draft is None:
        why = "off as asked" if mode == "off" else "none: no Lucebox draft given"
        return Speculation(None, None, None, None, why)
    why = (
        f"DFlash draft {draft.path.name} verified as a tree (DDTree, budget {flags.ddtree_budget})"
    )
    if flags.sampled_verify:
        why += "; sampled verification on"
    return Speculation("ddtree", draft, None, None, why)


def _foreign_draft_reason(draft_name: str | None) -> str:
    return (
        f"none: the draft {draft_name} is in llama-server's format, and the Lucebox engine "
        "takes a DFlash draft (this engine serves without speculation)"
    )


def _explained(
    placed: Placed,
    choice: EngineChoice,
    spec: Speculation,
    drafter: PrefillDrafter | None,
    engine: EngineView,
) -> Plan:
    """The placement's memory plan with the launch's reasons: the engine, the speculation,
    PFlash's drafter and kernel, and the placement."""
    plan = placed.planned.plan
    reasons = {**plan.reasons, "engine": choice.reason, "spec": spec.reason}
    if drafter is not None:
        reasons["prefill"] += _prefill_notes(drafter, engine)
    if placed.why:
        reasons["placement"] = placed.why
    return dataclasses.replace(plan, reasons=reasons)


def _kv_modes(paths: Paths, request: LuceboxRequest, launch: LaunchPlan) -> KvModesPlan | None:
    """The long-context modes of a launch whose context is long (none for a trial's launch:
    it pins one)."""
    plan, server = launch.plan, launch.server
    if plan.ctx < kvmodes.LONG_CTX_TOKENS or not launch.target.present:
        return None
    if launch.resolved.kv_type is not None:
        return None
    draft = Path(server.draft_path) if server.draft_path else None
    # The context asked for (0: none asked), not the one planned: an unasked context follows
    # the card's free memory from one start to the next, and a key that moved with it would
    # measure every mode again, and `plan` beside a running server would never find them.
    # At the sampling the calibration measures the served mix at, else the launch's defaults.
    sampling = launch.options.measured_at or launch.sampling.label
    key = measurements.key_for(
        launch.target.path, draft, launch.engine.id or launch.engine.version,
        launch.budget.device, request.ctx or 0, "", paths, sampling,
    )  # fmt: skip
    serving = kvmodes.served_label(plan.cache_type_k, plan.kvflash_pool_tokens)
    return kvmodes.plan_modes(
        paths, kvmodes.launch_key(key), kv_types_for(request), serving, plan.ctx
    )


@dataclass(frozen=True)
class Placed:
    """The placement that serves: its name, its cards' budget, its plan, and why ("" with one
    card)."""

    name: str
    budget: GpuBudget
    planned: LuceboxPlan
    why: str


def _place(
    paths: Paths,
    request: LuceboxRequest,
    target: ModelFile,
    draft: ModelFile | None,
    engine: EngineView,
    resolved: Resolved,
) -> Placed:
    """The placement that serves, among those this build offers on the two cards with the most
    free memory, weighed with the decode rates measured for them."""
    # The card with the most free memory holds the target; a second card may join it.
    cards = sorted(request.budget.local_gpus, key=lambda d: -d.vram_free_bytes)[:2]
    names = offered(
        engine.capabilities.features, len(cards), draft is not None,
        target.facts.architecture, resolved.prefill != "off",
    )  # fmt: skip
    key = placement_key(
        target.path, draft.path if draft else None, engine.id or engine.version,
        tuple(d.label for d in sorted(cards, key=lambda d: d.index)),
    )  # fmt: skip
    rates = read_placement_rates(paths, key) if len(names) > 1 else {}
    return _placed(request, cards, names, resolved, rates)


def _placed(
    request: LuceboxRequest,
    cards: list[DeviceBudget],
    names: tuple[PlacementName, ...],
    resolved: Resolved,
    rates: dict[str, float],
) -> Placed:
    """Each offered placement planned on its cards; --placement names one, else
    :func:`choose_placement` weighs them."""
    host = request.budget.host_total_bytes
    if not cards:  # no local GPU: the plan reports what the budget lacks
        return Placed("one", request.budget, plan_lucebox(request), "")
    plans: dict[PlacementName, tuple[GpuBudget, LuceboxPlan]] = {}
    for name in names:
        used = tuple(cards[:1] if name == "one" else cards[:2])
        budget = pool_of(used, host)
        plans[name] = (
            budget,
            plan_lucebox(
                dataclasses.replace(
                    request,
                    budget=budget,
                    placement=name,
                    cards=tuple((d.label, d.vram_free_bytes) for d in used),
                )
            ),
        )
    if len(names) == 1 and resolved.placement in ("auto", "one"):
        return Placed("one", *plans["one"], "")
    candidates = [
        Candidate(name, p.plan.fits, p.exact, p.plan.largest_ctx, rates.get(name))
        for name, (_, p) in plans.items()
    ]
    best, why = choose_placement(candidates, plans["one"][1].wanted_ctx)
    if resolved.placement != "auto" and resolved.placement in plans:
        asked = resolved.placement
        listed = why[why.index("(") :]
        return Placed(asked, *plans[asked], f"{PLACEMENT_TEXT[asked]}: as asked {listed}")
    if resolved.placement != "auto":
        offers = ", ".join(names)
        return Placed(best.name, *plans[best.name], f"this build and launch offer {offers}")
    return Placed(best.name, *plans[best.name], why)


def _placement_refusal(asked: str, placed: Placed) -> GuardRefusal | None:
    """The refusal of a --placement that this build and launch cannot serve."""
    if asked in ("auto", placed.name):
        return None
    return GuardRefusal(
        f"--placement {asked} is not possible here: {placed.why or 'one GPU'}",
        hint="pass --placement auto to let lucebox choose",
    )


def _refusal(
    choice: EngineChoice,
    target: ModelFile,
    draft: ModelFile | None,
    plan: Plan,
) -> GuardRefusal | None:
    if choice.refusal is not None:
        return GuardRefusal(
            f"the Lucebox engine cannot serve this: {choice.refusal}",
            hint="pass --engine auto to let lucebox choose, or --engine llama-server",
        )
    for model in (target, draft):
        if model is not None and model.check is not None and not model.check.usable:
            errors = [p.message for p in model.check.problems if p.severity == "error"]
            return GuardRefusal(f"{model.path.name}: {errors[0] if errors else 'refused'}")
    if not plan.fits:
        hint = (
            f"the largest context that fits is {plan.largest_ctx} tokens (--ctx {plan.largest_ctx})"
            if plan.largest_ctx >= MIN_CTX
            else "close the other programs that use the GPU, or serve a smaller model"
        )
        return GuardRefusal(f"the plan does not fit: {plan.reasons['fit']}", hint=hint)
    return None
