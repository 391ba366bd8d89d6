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

from lucebox.engine.core.errors import GuardRefusal
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import lucebox, luceboxbuild
from lucebox.engine.engines.bsa import SLOW_FALLBACK
from lucebox.engine.engines.known import KnownSource
from lucebox.engine.engines.registry import EngineCapabilities, EngineManifest, KindName
from lucebox.engine.machine.apikey import api_key_path
from lucebox.engine.machine.budget import DeviceBudget, GpuBudget, pool_of
from lucebox.engine.models.guard import verdict_of
from lucebox.engine.models.modelsource import parse_source
from lucebox.engine.models.presets import Preset
from lucebox.engine.models.records import stored_file, stored_path
from lucebox.engine.plan.enginechoice import EngineChoice, EngineFacts, choose_engine
from lucebox.engine.plan.engineview import EngineView
from lucebox.engine.plan.launch import ServerLaunch, key_file_of, private_port
from lucebox.engine.plan.launchplan import LaunchBasis, LaunchPlan, Speculation
from lucebox.engine.plan.lucebox import kvmodes
from lucebox.engine.plan.lucebox.kvmodes import KvModesPlan
from lucebox.engine.plan.lucebox.luceboxdevices import (
    PLACEMENT_TEXT,
    Candidate,
    PlacementName,
    choose_placement,
    offered,
)
from lucebox.engine.plan.lucebox.luceboxfit import build_memory
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
from lucebox.engine.plan.speculation import measurements
from lucebox.engine.plan.speculation.measurements import placement_key, read_placement_rates

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
    draft_info = draft.info if draft is not None else None
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
            draft_arch=draft_info.architecture
            if draft_info is not None
            else (draft.facts.architecture if draft is not None else None),
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


def lucebox_engine(paths: Paths, wanted_id: str) -> EngineView:
    """The installed Lucebox engine a launch uses (``engine.id``'s, else the default source's
    build), or the pinned one not built yet."""
    return _view(luceboxbuild.select(paths, wanted_id).engine)


def _view(installed: EngineManifest | None) -> EngineView:
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
    # Measured through lucebox serve on an H200
    # (benchmarks/results/h200x2-long-prompt-modes-gpu-pflash.json and a run without BSA): what
    # the client waited for the first token of a 128K prompt.
    if not engine.bsa:
        return notes + (
            f". {SLOW_FALLBACK} in {engine.id}: on an H200 without it PFlash took 22.7 s to "
            "the first token of a 128K prompt, 20.4 s of it scoring (31.2 s with PFlash off; "
            "2.1 s with the fast kernel)"
        )
    return notes + (
        f". {engine.id} has PFlash's fast kernel (Block-Sparse-Attention): on an H200 the "
        "first token of a 128K prompt came after 2.1 s instead of 28.6 s with PFlash off"
    )


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
) -> LaunchPlan:
    """The whole launch when the Lucebox engine serves."""
    resolved, target, ctx_cap = basis.resolved, basis.target, basis.ctx_cap
    engine = lucebox_engine(paths, resolved.engine_id)
    # The card with the most free memory holds the target; a second card may join it.
    cards = sorted(budget.local_gpus, key=lambda d: -d.vram_free_bytes)[:2]
    draft = _as_lucebox_draft(draft) if draft is not None and resolved.spec != "off" else None
    drafter = _prefill_drafter(paths) if resolved.prefill != "off" else None
    request = LuceboxRequest(
        target=target.facts,
        budget=budget,
        draft=draft.facts if draft is not None else None,
        ctx=resolved.ctx,
        ctx_cap=ctx_cap,
        kv_types=_kv_types(engine, resolved.kv_type),
        prefill=resolved.prefill,
        prefill_drafter=str(drafter.path) if drafter else None,
        prefill_drafter_bytes=drafter.size_bytes if drafter else PREFILL_DRAFTER_BYTES,
        kv_mode=resolved.kv_mode,
        build=build_memory(engine.version),
    )
    names = offered(
        engine.capabilities.features, len(cards), draft is not None,
        target.facts.architecture, resolved.prefill != "off",
    )  # fmt: skip
    key = placement_key(
        target.path, draft.path if draft else None, engine.id or engine.version,
        tuple(d.label for d in sorted(cards, key=lambda d: d.index)),
    )  # fmt: skip
    rates = read_placement_rates(paths, key) if len(names) > 1 else {}
    chosen, budget, planned, placement = _placed(request, cards, names, resolved, rates)
    if draft is not None:
        budget_text = planned.flags.ddtree_budget
        spec = Speculation(
            "ddtree",
            draft,
            None,
            None,
            f"DFlash draft {draft.path.name} verified as a tree (DDTree, budget {budget_text})"
            + ("; sampled verification on" if planned.flags.sampled_verify else ""),
        )
    else:
        why = "off as asked" if resolved.spec == "off" else "none: no Lucebox draft given"
        spec = Speculation(None, None, None, None, why)
    reasons = {**planned.plan.reasons, "engine": choice.reason, "spec": spec.reason}
    if drafter is not None:
        reasons["prefill"] += _prefill_notes(drafter, engine)
    if placement:
        reasons["placement"] = placement
    plan = dataclasses.replace(planned.plan, reasons=reasons)
    server_launch = ServerLaunch(
        server_path=engine.server_path,
        model_path=str(target.path),
        plan=plan,
        alias=basis.alias,
        host=resolved.host,
        port=resolved.port,
        engine_port=private_port(resolved.port),
        # The front checks the user's key; the engine itself has none and stays on loopback.
        api_key_file=key_file_of(str(api_key_path(paths)), resolved.host, resolved.has_api_key),
        draft_path=str(draft.path) if draft is not None else None,
        spec_type=spec.spec_type,
        gpus=tuple(d.index for d in budget.local_gpus),
        kind="lucebox",
        lucebox=planned.flags,
    )
    refusal = _refusal(choice, target, draft, plan)
    if refusal is None and resolved.placement not in ("auto", chosen):
        refusal = GuardRefusal(
            f"--placement {resolved.placement} is not possible here: {placement or 'one GPU'}",
            hint="pass --placement auto to let lucebox choose",
        )
    launch = basis.launch(
        server_launch, spec, budget=budget, engine=engine, refusal=refusal, engine_choice=choice
    )
    return dataclasses.replace(launch, kv_modes=_kv_modes(paths, request, launch))


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
    key = measurements.key_for(
        launch.target.path, draft, launch.engine.id or launch.engine.version,
        launch.budget.device, request.ctx or 0, "", paths,
    )  # fmt: skip
    serving = kvmodes.served_label(plan.cache_type_k, plan.kvflash_pool_tokens)
    return kvmodes.plan_modes(
        paths, kvmodes.launch_key(key), kv_types_for(request), serving, plan.ctx
    )


def _placed(
    request: LuceboxRequest,
    cards: list[DeviceBudget],
    names: tuple[PlacementName, ...],
    resolved: Resolved,
    rates: dict[str, float],
) -> tuple[str, GpuBudget, LuceboxPlan, str]:
    """The placement that serves: (its name, its cards' budget, its plan, why; "" with one
    card). Each offered placement is planned on its cards; --placement names one, else
    :func:`choose_placement` weighs them."""
    host = request.budget.host_total_bytes
    if not cards:  # no local GPU: the plan reports what the budget lacks
        return "one", request.budget, plan_lucebox(request), ""
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
        return "one", *plans["one"], ""
    candidates = [
        Candidate(name, p.plan.fits, p.exact, p.plan.largest_ctx, rates.get(name))
        for name, (_, p) in plans.items()
    ]
    best, why = choose_placement(candidates, plans["one"][1].wanted_ctx)
    if resolved.placement != "auto" and resolved.placement in plans:
        asked = resolved.placement
        listed = why[why.index("(") :]
        return asked, *plans[asked], f"{PLACEMENT_TEXT[asked]}: as asked {listed}"
    if resolved.placement != "auto":
        offers = ", ".join(names)
        return best.name, *plans[best.name], f"this build and launch offer {offers}"
    return best.name, *plans[best.name], why


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
