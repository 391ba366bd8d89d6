"""The one planner: (card, files or preset, flags + settings) -> the launch.

``plan_launch`` is the only code that turns what the user asked for into what runs: `up`,
`serve`, `plan`, `--dry-run`, `presets`, the TUI's preset table and the re-plan after an
out-of-memory start all call it, so whatever is planned is what launches. It reads headers
and runs the model checks (never downloads); with no engine built yet it plans with the
pinned engine's capabilities, kept beside the pin.
"""

from __future__ import annotations

from dataclasses import replace

from lucebox.engine.core.errors import GuardRefusal
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import kinds
from lucebox.engine.engines.kinds import LLAMA_SERVER, LUCEBOX
from lucebox.engine.engines.registry import EngineManifest, KindName
from lucebox.engine.machine.budget import GpuBudget, pool_of
from lucebox.engine.machine.config import Settings
from lucebox.engine.machine.gpu import GpuProbe
from lucebox.engine.models.checkresult import refusal as refusal_of
from lucebox.engine.models.modelfacts import ModelFacts
from lucebox.engine.models.presets import Preset
from lucebox.engine.models.projector import ProjectorInfo
from lucebox.engine.plan import engineverdict, prefillrates, savedslots, specchoice
from lucebox.engine.plan.engineview import EngineView, Installs
from lucebox.engine.plan.launchplan import LaunchBasis, LaunchPlan
from lucebox.engine.plan.lucebox import luceboxroute
from lucebox.engine.plan.lucebox.luceboxplan import KvMode
from lucebox.engine.plan.memory import cpuread
from lucebox.engine.plan.memory.cardchoice import keep_alone
from lucebox.engine.plan.memory.ctxchoice import wanted_ctx
from lucebox.engine.plan.memory.memory import Plan, make_plan
from lucebox.engine.plan.memory.request import KV_PAIRS, PlanRequest
from lucebox.engine.plan.modelfiles import ModelFile, launch_files
from lucebox.engine.plan.options import Resolved, ServeOptions, resolve
from lucebox.engine.plan.sideplan import with_side_models
from lucebox.engine.plan.speculation.speculation import SpecMode
from lucebox.engine.plan.users import fit_users, llama_users, queued_users
from lucebox.engine.plan.visionplan import choose_vision, lucebox_vision


def _weigh_swa_full(request: PlanRequest) -> PlanRequest:
    """Keep --swa-full when the context it leaves is still enough for an agent session."""
    with_full = make_plan(request)
    wanted = wanted_ctx(request.ctx, request.target.native_ctx)
    if with_full.fits and with_full.ctx >= wanted:
        return request
    return replace(request, swa_full=False)


def plan_launch(
    paths: Paths,
    options: ServeOptions,
    *,
    resolved: Resolved,
    budget: GpuBudget,
    installs: Installs,
    preset: Preset | None = None,
    ctx_cap: int | None = None,
    remote_facts: ModelFacts | None = None,
    projectors: tuple[ProjectorInfo, ...] = (),
) -> LaunchPlan:
    """The chat launch (:func:`_plan_chat`) with its embedding and reranker models planned in
    the memory it leaves (sidemodels): the chat model is planned first and keeps its memory."""
    chat = _plan_chat(
        paths, options, resolved=resolved, budget=budget, installs=installs, preset=preset,
        ctx_cap=ctx_cap, remote_facts=remote_facts, projectors=projectors,
    )  # fmt: skip
    return with_side_models(paths, chat)


def _plan_chat(
    paths: Paths,
    options: ServeOptions,
    *,
    resolved: Resolved,
    budget: GpuBudget,
    installs: Installs,
    preset: Preset | None = None,
    ctx_cap: int | None = None,
    remote_facts: ModelFacts | None = None,
    projectors: tuple[ProjectorInfo, ...] = (),
) -> LaunchPlan:
    """The launch for ``options`` on ``budget`` with ``installs`` (every engine kind's build,
    found once by the caller: :func:`find_installs`); reads headers, never fetches.

    ``resolved`` is ``options`` over config.toml (``resolve``, once per decision); ``preset`` is
    the model set already chosen (None with --model); ``ctx_cap`` bounds the context after an
    out-of-memory start. With several GPUs, a model that fits one of them runs
    there alone unless the split buys 1.5x the context or a more precise KV type (cardchoice);
    otherwise it is spread over all of them.
    Peers asked for with --rpc are always used: the user asked for the split.
    ``remote_facts`` are the target's facts read from the Hub (a quant of a repo named by name)
    for a file not downloaded yet; ``projectors`` are the vision projectors of its repo, where
    the store keeps (or will keep) them.
    """

    def plan_on(devices: GpuBudget) -> LaunchPlan:
        return _plan_on_budget(
            paths, options, resolved=resolved, budget=devices, installs=installs, preset=preset,
            ctx_cap=ctx_cap, remote_facts=remote_facts, projectors=projectors,
        )  # fmt: skip

    pooled = plan_on(budget)
    if len(budget.devices) < 2 or any(d.address for d in budget.devices):
        return pooled
    if pooled.served_by.weighs_its_own_cards:
        return pooled
    roomiest = max(budget.devices, key=lambda d: d.vram_free_bytes)
    alone = plan_on(pool_of((roomiest,), budget.host_total_bytes))
    plan = alone.plan
    if alone.refusal is not None or plan.n_gpu_layers >= 0 or plan.n_cpu_moe:
        return pooled
    split = pooled.plan if pooled.refusal is None else None
    keep, why = keep_alone(plan, split, alone.budget.device)
    chosen = alone if keep else pooled
    said = chosen.plan.reasons.get("split")
    reasons = {**chosen.plan.reasons, "split": "; ".join(filter(None, [said, why]))}
    return chosen.with_plan(replace(chosen.plan, reasons=reasons))


def _plan_on_budget(
    paths: Paths,
    options: ServeOptions,
    *,
    resolved: Resolved,
    budget: GpuBudget,
    installs: Installs,
    preset: Preset | None,
    ctx_cap: int | None,
    remote_facts: ModelFacts | None = None,
    projectors: tuple[ProjectorInfo, ...] = (),
) -> LaunchPlan:
    engine = installs.llama_server
    target, draft = launch_files(paths, options, preset, engine, resolved.allow_base, remote_facts)
    request = _memory_request(paths, target, budget, resolved, engine, ctx_cap)
    request, fewer_users = fit_users(request, resolved.users, make_plan)
    llama_plan = make_plan(request) if resolved.ctx and resolved.engine_mode == "auto" else None
    sampled_at = options.measured_at or specchoice.sampling_label(preset, target)
    engines_key = specchoice.engines_key(paths, target, draft, engine, budget, request, sampled_at)
    measured = engineverdict.read_engines(paths, engines_key) if engines_key else None
    choice = luceboxroute.choose(
        resolved,
        target,
        draft,
        budget,
        llama_plan,
        preset,
        measured=(measured.chosen, measured.why) if measured and measured.chosen else None,
        missing_build=installs.missing_build,
    )
    choice = replace(choice, key=engines_key if choice.both else None)
    basis = LaunchBasis(options, resolved, preset, target, ctx_cap, installs)
    if not kinds.kind(choice.kind).allocates_like_llama_cpp:
        launch = luceboxroute.lucebox_launch(paths, basis, draft, budget, choice, installs.lucebox)
        vision, refused = lucebox_vision(resolved, target, projectors)
        users = queued_users(resolved.users, launch.plan.ctx)
        return replace(launch, vision=vision, refusal=launch.refusal or refused, users=users)

    def served(held: PlanRequest) -> Plan:
        return specchoice.choose_speculation(
            paths, held, target, draft, preset, engine, resolved, options
        )[1]

    vision, request, vision_refusal = choose_vision(request, resolved, target, projectors, served)
    spec_choice, memory, refusal = specchoice.choose_speculation(
        paths, request, target, draft, preset, engine, resolved, options
    )
    reasons = {**memory.reasons, "vision": vision.reason}
    if resolved.cache == "agent":
        reasons["disk_cache"] = savedslots.saved_slots_reason(paths.slots_dir)
    memory = replace(memory, reasons=reasons)
    server = replace(
        basis.server(paths, engine, memory, budget, spec_choice),
        chat_template=preset.chat_template if preset else None,
        sampling=tuple(sorted(preset.sampling.items())) if preset else (),
        slot_save_path=str(paths.slots_dir) if resolved.cache == "agent" else None,
        rpc=tuple(d.address for d in budget.devices if d.address),
        mmproj_path=vision.path,
    )
    return basis.launch(
        server,
        spec_choice,
        budget=budget,
        refusal=refusal or vision_refusal or _refusal(target, memory),
        engine_choice=choice,
        vision=vision,
        users=llama_users(resolved.users, memory, fewer_users),
    )


def _memory_request(
    paths: Paths,
    target: ModelFile,
    budget: GpuBudget,
    resolved: Resolved,
    engine: EngineView,
    ctx_cap: int | None,
) -> PlanRequest:
    """What the memory planner is asked: the agent profile caches prompts (and keeps the whole
    sliding window when that still leaves enough context)."""
    agent = resolved.cache == "agent"
    swa_full = agent and target.facts.swa_kv_elems_per_token > 0
    read = None
    if not budget.is_gpu and resolved.ctx is None:
        cores = cpuread.cpu_cores()
        rate = prefillrates.read_prefill(paths, target.path, cores) if target.present else None
        read = cpuread.read_cap(
            target.facts, resolved.cpu_read_s, cores, rate.tok_s if rate else None
        )
    request = PlanRequest(
        target=target.facts,
        budget=budget,
        ctx=resolved.ctx,
        keep_free_bytes=resolved.keep_free_ram_bytes,
        read_cap_ctx=read.ctx if read else None,
        read_cap_reason=read.reason if read else "",
        kv_types=engine.capabilities.kv_cache_types or KV_PAIRS,
        ctx_cap=ctx_cap,
        swa_full=swa_full,
        prompt_cache=agent,
        checkpoints=agent
        and (target.facts.recurrent_state_bytes > 0 or target.facts.swa_kv_elems_per_token > 0),
    )
    return _weigh_swa_full(request) if swa_full else request


def _refusal(target: ModelFile, memory: Plan) -> GuardRefusal | None:
    if target.check is not None and not target.check.usable:
        return refusal_of(target.check)
    if not memory.fits:
        reason = (
            memory.reasons.get("too_slow")
            or memory.reasons.get("ram")
            or memory.reasons.get("ctx")
            or memory.reasons.get("fits", "")
        )
        return GuardRefusal(
            f"the plan does not fit: {reason}",
            hint=f"the largest context that fits is {memory.largest_ctx} tokens",
        )
    return None


def replan(
    paths: Paths,
    launch: LaunchPlan,
    settings: Settings,
    *,
    ctx_cap: int | None = None,
    spec: SpecMode | None = None,
    spec_type: str | None = None,
    draft_max: int | None = None,
    p_min: float | None = None,
    engine_kind: KindName | None = None,
    kv: tuple[KvMode, str, int] | None = None,
    measured_at: str | None = None,
) -> LaunchPlan:
    """``launch`` planned again (same options, files, card and engine) with a context bound, a
    shorter draft or another speculation mode: after an out-of-memory start, or when the
    speculation guard decides; or on the engine ``engine_kind`` (the calibration's); or with
    ``kv`` (mode, cache type, context) pinned: a long-context mode's trial."""
    options = replace(
        launch.options,
        spec=spec or launch.options.spec,
        spec_type=spec_type or launch.options.spec_type,
        draft_max=draft_max if draft_max is not None else launch.options.draft_max,
        p_min=p_min if p_min is not None else launch.options.p_min,
        engine=engine_kind or launch.options.engine,
        measured_at=measured_at or launch.options.measured_at,
    )
    if kv is not None:
        options = replace(options, kv_mode=kv[0], kv_type=kv[1], ctx=kv[2])
    return plan_launch(
        paths,
        options,
        resolved=resolve(options, settings),
        budget=launch.budget,
        installs=launch.installs,
        preset=launch.preset,
        ctx_cap=ctx_cap or launch.ctx_cap,
        remote_facts=None if launch.target.present else launch.target.facts,
        projectors=(launch.vision.projector,) if launch.vision.projector else (),
    )


def smaller_context_plan(paths: Paths, launch: LaunchPlan, settings: Settings) -> LaunchPlan:
    """The re-plan after an out-of-memory start: three quarters of the context, recomputed.

    A context the user asked for is never shrunk: that raises the refusal with the numbers.
    """
    served = launch.plan.ctx
    if launch.resolved.ctx is not None:
        raise GuardRefusal(
            f"the engine ran out of memory at the {served}-token context you asked for",
            hint="ask for a smaller --ctx (or model.ctx), or free GPU memory",
        )
    return replan(paths, launch, settings, ctx_cap=served * 3 // 4)


def find_installs(paths: Paths, probe: GpuProbe, wanted_id: str = "") -> Installs:
    """Every engine kind's installed build a launch would use (``wanted_id`` names one),
    found once for the plans a caller makes."""
    return installs_of(
        LLAMA_SERVER.select(paths, probe, wanted_id).engine,
        LUCEBOX.select(paths, probe, wanted_id).engine,
    )


def installs_of(
    llama_server: EngineManifest | None = None, lucebox: EngineManifest | None = None
) -> Installs:
    """The builds a plan is made for from the installed ones; each kind not built yet is
    planned with its pinned source's capabilities."""
    return Installs(EngineView.of(llama_server), luceboxroute.lucebox_view(lucebox))
