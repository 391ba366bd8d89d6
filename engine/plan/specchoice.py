"""The speculation a launch plans with: the candidates the files and engine allow, the one whose
memory leaves the context, the measurement store's verdict at the sampling the requests get, and
the store's keys for this launch (speculation and engine verdicts)."""

from __future__ import annotations

from dataclasses import replace

from lucebox.engine.core.errors import GuardRefusal
from lucebox.engine.core.paths import Paths
from lucebox.engine.machine.budget import GpuBudget
from lucebox.engine.models.modelfacts import ModelFacts
from lucebox.engine.models.presets import Preset
from lucebox.engine.plan import engineverdict
from lucebox.engine.plan.engineview import EngineView
from lucebox.engine.plan.launchplan import Speculation
from lucebox.engine.plan.memory.ctxchoice import wanted_ctx
from lucebox.engine.plan.memory.memory import Plan, make_plan
from lucebox.engine.plan.memory.request import PlanRequest
from lucebox.engine.plan.modelfiles import ModelFile
from lucebox.engine.plan.options import Resolved, ServeOptions
from lucebox.engine.plan.samplingdefaults import sampling_defaults
from lucebox.engine.plan.speculation import measurements, specguard, speculation
from lucebox.engine.plan.speculation.speculation import SpecFiles, SpecMode


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


def choose_speculation(
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
    sampled_at = options.measured_at or sampling_label(preset, target)
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


def sampling_label(preset: Preset | None, target: ModelFile) -> str:
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


def engines_key(
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
