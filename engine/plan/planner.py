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
from lucebox.engine.models.guard import refusal as refusal_of
from lucebox.engine.models.modelfacts import ModelFacts
from lucebox.engine.models.presets import Preset
from lucebox.engine.models.projector import ProjectorInfo
from lucebox.engine.plan import engineverdict, prefillrates, savedslots
from lucebox.engine.plan.engineview import EngineView, Installs
from lucebox.engine.plan.launchplan import LaunchBasis, LaunchPlan, Speculation
from lucebox.engine.plan.lucebox import luceboxroute
from lucebox.engine.plan.lucebox.luceboxplan import KvMode
from lucebox.engine.plan.memory import cpuread
from lucebox.engine.plan.memory.cardchoice import keep_alone
from lucebox.engine.plan.memory.ctxchoice import wanted_ctx
from lucebox.engine.plan.memory.memory import Plan, make_plan
from lucebox.engine.plan.memory.request import KV_PAIRS, PlanRequest
from lucebox.engine.plan.modelfiles import ModelFile, launch_files
from lucebox.engine.plan.options import Resolved, ServeOptions, resolve
from lucebox.engine.plan.samplingdefaults import sampling_defaults
from lucebox.engine.plan.sideplan import with_side_models
from lucebox.engine.plan.speculation import measurements, specguard, speculation
from lucebox.engine.plan.speculation.speculation import SpecFiles, SpecMode
from lucebox.engine.plan.users import fit_users, llama_users, queued_users
from lucebox.engine.plan.visionplan import choose_vision, lucebox_vision


def _mtp_facts(target: ModelFacts) -> ModelFacts:
    """The MTP head as the engine runs it: a one-layer draft context over the target."""
    return replace(
        target,
        name=f"{target.name} MTP layers",
        weights_bytes=0,
        layer_bytes=0,
        host_bytes=0,
        expert_bytes=0,
        n_layer=1,
        full_kv_elems_per_token=target.max_layer_kv_elems,
        swa_kv_elems_per_token=0,
        recurrent_state_bytes=0,
    )


def _spec_files(target: ModelFile, draft: ModelFile | None, preset: Preset | None) -> SpecFiles:
    info = target.info
    draft_check = draft.check if draft else None
    refused = (
        [p.message for p in draft_check.problems if p.severity == "error"] if draft_check else []
    )
    preset_draft = preset.draft if preset else None
    return SpecFiles(
        target_name=target.facts.name,
        target_has_mtp=bool(info and info.has_mtp_layers),
        target_is_moe=target.facts.expert_bytes > 0,
        draft_name=draft.path.name if draft else None,
        draft_type=(draft_check.speculative_type if draft_check else None)
        or (preset_draft.spec_type if preset_draft and draft else None),
        draft_problem=refused[0] if refused else None,
        preset_type=preset_draft.spec_type if preset_draft and info is None else None,
        preset_draft_max=preset_draft.draft_max if preset_draft else None,
    )


def _weigh(
    request: PlanRequest,
    found: list[speculation.SpecCandidate],
    draft: ModelFile | None,
    mode: SpecMode,
) -> tuple[speculation.SpecCandidate | None, Plan, list[str]]:
    """The first candidate whose memory does not cost the context a plan without it gets."""
    plain = make_plan(request)
    wanted = min(plain.ctx, wanted_ctx(request.ctx, request.target.native_ctx))
    passed: list[str] = []
    for candidate in found:
        extra = None
        if candidate.uses_draft_file and draft is not None:
            extra = draft.facts
        elif speculation.model_type(candidate.spec_type) == "draft-mtp":
            extra = _mtp_facts(request.target)
        if extra is None:
            return candidate, plain, passed
        planned = make_plan(replace(request, draft=extra))
        if mode != "auto":
            return candidate, planned, passed
        # q8_0 KV is near-lossless and worth a working draft; q4_0 is not.
        precision_lost = planned.cache_type_k == "q4_0" and plain.cache_type_k != "q4_0"
        if planned.fits and planned.ctx >= wanted and not precision_lost:
            return candidate, planned, passed
        cost = (
            f"{planned.ctx} tokens with {planned.cache_type_k} KV instead of "
            f"{plain.ctx} with {plain.cache_type_k}"
        )
        passed.append(f"not {candidate.spec_type}: its memory would leave {cost}")
    return None, plain, passed


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
    sampled_at = options.measured_at or _sampling_label(preset, target)
    engines_key = _engines_key(paths, target, draft, engine, budget, request, sampled_at)
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
        return _choose_speculation(paths, held, target, draft, preset, engine, resolved, options)[1]

    vision, request, vision_refusal = choose_vision(request, resolved, target, projectors, served)
    spec_choice, memory, refusal = _choose_speculation(
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


def _choose_speculation(
    paths: Paths,
    request: PlanRequest,
    target: ModelFile,
    draft: ModelFile | None,
    preset: Preset | None,
    engine: EngineView,
    resolved: Resolved,
    options: ServeOptions,
) -> tuple[Speculation, Plan, GuardRefusal | None]:
    """The speculation the files and engine allow, weighed against the context it costs; the
    memory plan it leaves; a refusal when a mode the user forced is impossible."""
    on_gpu = request.budget.is_gpu
    files = _spec_files(target, draft, preset)
    spec_types = engine.capabilities.spec_types
    found = speculation.candidates(files, spec_types)
    cpu_note = ""
    if resolved.spec == "auto":
        found, cpu_note = speculation.for_backend(
            found, on_gpu, user_draft=options.draft is not None
        )
    allowed = speculation.for_mode(found, resolved.spec)
    if options.spec_type is not None and resolved.spec != "off":
        allowed = [c for c in found if c.spec_type == options.spec_type]
    sampled_at = options.measured_at or _sampling_label(preset, target)
    key = _measurement_key(paths, target, draft, engine, request.budget, make_plan(request))
    key = replace(key, sampling=sampled_at) if key is not None else None
    candidates = tuple(allowed)
    if key is not None and resolved.spec == "auto":
        # Only what auto could serve is worth measuring: not a draft whose memory costs context.
        candidates = tuple(c for c in allowed if _weigh(request, [c], draft, "auto")[0])
    verdict, off_why = None, ""
    if key is not None and resolved.spec == "auto" and options.draft_max is None:
        measured = measurements.read_measurement(paths, key)
        verdict = measurements.measured_choice(allowed, measured)
        off_why = _measured_off(measured, allowed) if verdict == [] else ""
        allowed = allowed if verdict is None else verdict
    refusal: GuardRefusal | None = None
    if resolved.spec not in ("auto", "off") and not allowed:
        refusal = GuardRefusal(
            speculation.unavailable_reason(files, resolved.spec, spec_types),
            hint="pass --spec auto to let lucebox choose, or --spec off",
        )
    chosen, memory, passed = _weigh(request, allowed, draft, resolved.spec)
    passed = [n for n in (cpu_note, speculation.tried_on_cpu(chosen, on_gpu)) if n] + passed
    if chosen is not None and options.draft_max is not None:
        why = f"{chosen.why}; drafts shortened to {options.draft_max} tokens (low acceptance)"
        chosen = replace(chosen, draft_max=options.draft_max, why=why)
    if chosen is not None and options.p_min is not None:
        chosen = replace(chosen, p_min=options.p_min, why=f"{chosen.why}, p-min {options.p_min:g}")
    chosen_by = ""
    if resolved.spec != "auto" and options.spec is not None:
        chosen_by = f"--spec {resolved.spec} as asked"
    elif resolved.spec != "auto":
        chosen_by = f'model.spec = "{resolved.spec}" in config.toml'
    spec_choice = _speculation(
        chosen,
        draft,
        resolved.spec,
        passed,
        chosen_by=chosen_by,
        on_gpu=on_gpu,
        shortened=options.draft_max is not None,
        measured_off=off_why,
        measured=bool(verdict),
    )
    spec_choice = replace(spec_choice, candidates=candidates, measurement_key=key)
    memory = replace(memory, reasons={**memory.reasons, "spec": spec_choice.reason})
    return spec_choice, memory, refusal


def _measured_off(
    measured: measurements.Measurement | None, found: list[speculation.SpecCandidate]
) -> str:
    """Why the store says no speculation here: the guard's switch-off while serving, or the
    calibration's verdict."""
    if measured is None:
        return ""
    guard = measured.switched_off(found[0].spec_type) if found else None
    return f"switched off by the guard while serving: {guard}" if guard else measured.why


def _speculation(
    chosen: speculation.SpecCandidate | None,
    draft: ModelFile | None,
    mode: SpecMode,
    passed: list[str],
    *,
    chosen_by: str,
    on_gpu: bool,
    shortened: bool,
    measured_off: str = "",
    measured: bool = False,
) -> Speculation:
    """``chosen_by`` names where a mode the user chose comes from ("" under auto);
    ``measured_off`` says why the measurement store found no mode faster than none here."""
    tail = "; ".join(passed)
    if chosen is None:
        why = "none possible with these files and engine"
        if mode == "off":
            why = "off as asked"
        elif measured_off:
            why = f"off: {measured_off}"
        return Speculation(None, None, None, None, "; ".join(filter(None, [why, tail])))
    warn = f" ({chosen_by})" if chosen_by else ""
    watch = specguard.describe(
        chosen.spec_type,
        chosen.draft_max,
        on_gpu,
        user_chose=bool(chosen_by),
        shortened=shortened,
        measured=measured,
    )
    return Speculation(
        chosen.spec_type,
        draft if chosen.uses_draft_file else None,
        chosen.draft_max,
        chosen.p_min,
        "; ".join(filter(None, [chosen.why + warn, watch, tail])),
    )


def _sampling_label(preset: Preset | None, target: ModelFile) -> str:
    """The sampling a launch's requests get by default, as the measurement store names it."""
    info = target.info
    defaults = sampling_defaults(
        preset.sampling if preset else None, info.sampling if info else None
    )
    return defaults.label


def _measurement_key(
    paths: Paths,
    target: ModelFile,
    draft: ModelFile | None,
    engine: EngineView,
    budget: GpuBudget,
    plain: Plan,
) -> measurements.MeasurementKey | None:
    """The store's key for this launch: the files, the build, the card, and the context and KV
    types the target gets without speculation."""
    if not target.present:
        return None
    return measurements.key_for(
        target.path,
        draft.path if draft is not None and draft.present else None,
        f"{engine.id or 'pinned'} {engine.version}",
        budget.device,
        plain.ctx,
        f"{plain.cache_type_k}/{plain.cache_type_v}",
        paths,
    )


def _engines_key(
    paths: Paths,
    target: ModelFile,
    draft: ModelFile | None,
    engine: EngineView,
    budget: GpuBudget,
    request: PlanRequest,
    sampled_at: str,
) -> str | None:
    """The store's key for the engines' verdict on this launch: the files, the card, the
    context llama-server plans and the sampling its requests get (not the build: a verdict
    outlives a rebuild of either)."""
    key = _measurement_key(paths, target, draft, engine, budget, make_plan(request))
    return engineverdict.launch_key(replace(key, sampling=sampled_at)) if key else None


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
