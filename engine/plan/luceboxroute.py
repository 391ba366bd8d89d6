"""The planner's route to the Lucebox engine: which engine, and the launch when it serves.

Called by :func:`lucebox.engine.plan.planner.plan_launch`. The decisions themselves are pure
and live in :mod:`enginechoice` (which engine) and :mod:`luceboxplan` (memory and flags).
"""

from __future__ import annotations

import dataclasses

from lucebox.engine.core.errors import GuardRefusal
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import lucebox, luceboxbuild
from lucebox.engine.engines.registry import EngineCapabilities
from lucebox.engine.machine.apikey import api_key_path
from lucebox.engine.machine.budget import GpuBudget, pool_of
from lucebox.engine.models.guard import verdict_of
from lucebox.engine.models.presets import Preset
from lucebox.engine.plan.enginechoice import EngineChoice, EngineFacts, choose_engine
from lucebox.engine.plan.engineview import EngineView
from lucebox.engine.plan.launch import ServerLaunch, key_file_of, private_port
from lucebox.engine.plan.launchplan import LaunchBasis, LaunchPlan, Speculation
from lucebox.engine.plan.luceboxplan import (
    PREFILL_DRAFTER_BYTES,
    PREFILL_DRAFTER_SOURCE,
    LuceboxRequest,
    plan_lucebox,
)
from lucebox.engine.plan.memory import MIN_CTX, Plan
from lucebox.engine.plan.modelfiles import ModelFile, local_file
from lucebox.engine.plan.options import Resolved

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
) -> EngineChoice:
    """The engine for this launch, from what the planner has read; ``llama_plan`` is
    llama-server's plan for the context asked for (None when none was asked for)."""
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
        )
    )


def lucebox_engine(paths: Paths, wanted_id: str) -> EngineView:
    """The installed Lucebox engine a launch uses (``engine.id``'s, else the default source's
    build), or the pinned one not built yet."""
    installed = luceboxbuild.select(paths, wanted_id).engine
    if installed is not None:
        return EngineView.of(installed)
    caps = EngineCapabilities(
        spec_types=("dflash", "ddtree"),
        kv_cache_types=luceboxbuild.SYMMETRIC_KV_TYPES,
        model_archs=PINNED_ARCHS,
        features=("prefill-compression", "kvflash", "sampled-verify", "symmetric-kv-only"),
    )
    version = f"luce-dflash {lucebox.PIN.short} ({lucebox.PIN.date}), not built yet"
    return EngineView(None, version, luceboxbuild.SERVER, caps)


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
    gpus = budget.local_gpus
    if len(gpus) > 1:  # the engine serves from one GPU: the one with the most free memory
        budget = pool_of((max(gpus, key=lambda d: d.vram_free_bytes),), budget.host_total_bytes)
    draft = _as_lucebox_draft(draft) if draft is not None and resolved.spec != "off" else None
    drafter = local_file(paths, PREFILL_DRAFTER_SOURCE) if resolved.prefill != "off" else None
    planned = plan_lucebox(
        LuceboxRequest(
            target=target.facts,
            budget=budget,
            draft=draft.facts if draft is not None else None,
            ctx=resolved.ctx,
            ctx_cap=ctx_cap,
            kv_types=engine.capabilities.kv_cache_types or luceboxbuild.SYMMETRIC_KV_TYPES,
            prefill=resolved.prefill,
            prefill_drafter=str(drafter) if drafter else None,
            prefill_drafter_bytes=drafter.stat().st_size if drafter else PREFILL_DRAFTER_BYTES,
        )
    )
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
    refusal = _refusal(choice, target, draft, plan, resolved, drafter is not None)
    return basis.launch(
        server_launch, spec, budget=budget, engine=engine, refusal=refusal, engine_choice=choice
    )


def _refusal(
    choice: EngineChoice,
    target: ModelFile,
    draft: ModelFile | None,
    plan: Plan,
    resolved: Resolved,
    has_drafter: bool,
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
    if resolved.prefill != "off" and not has_drafter:
        return GuardRefusal(
            "PFlash needs its prefill drafter (Qwen3-0.6B in BF16), which is not on disk",
            hint=f"run `lucebox models pull {PREFILL_DRAFTER_SOURCE}`, or pass --prefill off",
        )
    if not plan.fits:
        hint = (
            f"the largest context that fits is {plan.largest_ctx} tokens (--ctx {plan.largest_ctx})"
            if plan.largest_ctx >= MIN_CTX
            else "close the other programs that use the GPU, or serve a smaller model"
        )
        return GuardRefusal(f"the plan does not fit: {plan.reasons['fit']}", hint=hint)
    return None
