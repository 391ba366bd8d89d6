"""The one planner: (card, files or preset, flags + settings) -> the launch.

``plan_launch`` is the only code that turns what the user asked for into what runs: `up`,
`serve`, `plan`, `--dry-run`, `presets`, the TUI's preset table and the re-plan after an
out-of-memory start all call it, so whatever is planned is what launches. It reads headers
and runs the model checks (never downloads); with no engine built yet it plans with the
pinned engine's capabilities, kept beside the pin.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import psutil

from lucebox.engine.core.address import is_loopback
from lucebox.engine.core.errors import GuardRefusal, UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.core.units import MIB
from lucebox.engine.engines.registry import EngineCapabilities, EngineManifest
from lucebox.engine.machine.apikey import api_key_path
from lucebox.engine.machine.budget import DeviceBudget, GpuBudget
from lucebox.engine.machine.config import Settings
from lucebox.engine.machine.gpu import GpuProbe
from lucebox.engine.models.gguf import ModelInfo
from lucebox.engine.models.guard import CheckResult, Problem, check_model, check_pair
from lucebox.engine.models.guard import refusal as refusal_of
from lucebox.engine.models.modelfacts import ModelFacts, facts_from_info
from lucebox.engine.models.presets import Preset, PresetModel, facts_from_preset
from lucebox.engine.models.store import list_models, parse_source
from lucebox.engine.plan import specguard, speculation
from lucebox.engine.plan.enginechoice import ENGINE_MODES, EngineChoice, EngineMode
from lucebox.engine.plan.launch import (
    LaunchSpec,
    server_argv,
    server_env,
)
from lucebox.engine.plan.luceboxplan import PrefillMode
from lucebox.engine.plan.memory import (
    ENOUGH_CTX,
    KV_PAIRS,
    Plan,
    PlanRequest,
    make_plan,
)
from lucebox.engine.plan.speculation import SpecFiles, SpecMode

CacheProfile = Literal["agent", "off"]
"""A preset is a candidate for `lucebox up` when it fits with at least this much context."""
PLANNED_SERVER_PATH = "llama-server"
"""argv[0] of a plan made before any engine is built (the build decides the folder)."""


@dataclass(frozen=True)
class ServeOptions:
    """What the user asked for on the command line; None means "not given"."""

    preset: str | None = None
    model: str | None = None
    draft: str | None = None
    spec: SpecMode | None = None
    cache: CacheProfile | None = None
    ctx: int | None = None
    host: str | None = None
    port: int | None = None
    gpus: tuple[int, ...] | None = None
    """NVML indices of the GPUs to use; None reads gpu.indices (empty: every NVIDIA GPU)."""
    allow_base: bool = False
    vram_mib: tuple[int, ...] | None = None
    """Plan for cards with this much free memory instead of the GPUs that are here."""
    draft_max: int | None = None
    """A shorter draft length than the mode's own (the speculation guard's re-plan)."""
    rpc: tuple[str, ...] | None = None
    """``host:port`` of `lucebox worker` peers; None reads rpc.peers."""
    engine: EngineMode | None = None
    """Which engine serves; None reads engine.kind (empty: auto, the planner chooses)."""
    prefill: PrefillMode | None = None
    """PFlash speculative prefill on the Lucebox engine; None is off."""

    def to_args(self) -> list[str]:
        """The `lucebox serve` arguments that give these options."""
        pairs = [
            ("--preset", self.preset),
            ("--model", self.model),
            ("--draft", self.draft),
            ("--spec", self.spec),
            ("--cache", self.cache),
            ("--ctx", self.ctx),
            ("--host", self.host),
            ("--port", self.port),
            ("--gpus", ",".join(map(str, self.gpus)) if self.gpus is not None else None),
            ("--vram-mib", ",".join(map(str, self.vram_mib)) if self.vram_mib else None),
            ("--rpc", ",".join(self.rpc) if self.rpc is not None else None),
            ("--engine", self.engine),
            ("--prefill", self.prefill),
        ]
        args = [item for flag, value in pairs if value is not None for item in (flag, str(value))]
        return [*args, "--allow-base"] if self.allow_base else args


@dataclass(frozen=True)
class Resolved:
    """Flags over config.toml, resolved once: every launch decision reads this."""

    preset_id: str | None
    ctx: int | None
    spec: SpecMode
    cache: CacheProfile
    host: str
    port: int
    gpus: tuple[int, ...]
    """The GPUs asked for; empty: every NVIDIA GPU lucebox finds."""
    rpc: tuple[str, ...]
    """The RPC peers asked for, in the order the engine numbers their devices."""
    allow_base: bool
    api_key: str | None
    engine: EngineMode = "auto"
    engine_from: str = ""
    """Where a mode other than auto comes from, for the plan's reason."""
    prefill: PrefillMode = "off"


def resolve(options: ServeOptions, settings: Settings) -> Resolved:
    spec = options.spec or settings.spec or "auto"
    if spec not in speculation.SPEC_MODES:
        raise UsageError(
            f"model.spec = {spec!r} in config.toml is not a speculation mode",
            hint=f"use one of {', '.join(speculation.SPEC_MODES)}",
        )
    engine = options.engine or settings.engine_kind or "auto"
    if engine not in ENGINE_MODES:
        raise UsageError(
            f"engine.kind = {engine!r} in config.toml is not an engine",
            hint=f"use one of {', '.join(ENGINE_MODES)}",
        )
    engine_from = (
        f"--engine {engine} as asked"
        if options.engine
        else f'engine.kind = "{engine}" in config.toml'
    )
    return Resolved(
        preset_id=None if options.model else (options.preset or settings.preset or None),
        ctx=options.ctx or settings.ctx or None,
        spec=spec,
        cache=options.cache or "agent",
        host=options.host or settings.host,
        port=options.port or settings.port,
        gpus=options.gpus if options.gpus is not None else settings.gpu_indices,
        rpc=options.rpc if options.rpc is not None else settings.rpc_peers,
        allow_base=options.allow_base or settings.allow_base,
        api_key=settings.api_key or None,
        engine=engine,
        engine_from=engine_from,
        prefill=options.prefill or "off",
    )


# --- the machine ------------------------------------------------------------------------------


def budget_for(
    probe: GpuProbe,
    gpus: tuple[int, ...] = (),
    vram_mib: tuple[int, ...] | None = None,
    peers: tuple[DeviceBudget, ...] = (),
) -> GpuBudget:
    """The memory a plan may use: RPC peers' devices (first: see below) and hypothetical
    cards (--vram-mib), the GPUs, or the RAM.

    The engine's device list is the RPC devices first, in --rpc order, then this PC's GPUs
    (llama_model_load in src/llama.cpp of the pinned source: "add RPC servers at the front of
    the list"); --tensor-split and --main-gpu index that list, so the budget keeps its order.
    """
    host_total = psutil.virtual_memory().total
    if vram_mib:
        cards = tuple(
            DeviceBudget(i, f"a {mib} MiB card", mib * MIB, mib * MIB)
            for i, mib in enumerate(vram_mib)
        )
        return pool_of(peers + cards, host_total)
    known = {gpu.index: gpu for gpu in probe.gpus}
    missing = [i for i in gpus if i not in known]
    if missing:
        found = ", ".join(str(i) for i in known) or "none"
        raise UsageError(
            f"there is no GPU {', '.join(map(str, missing))} (NVIDIA GPUs here: {found})",
            hint="pick from `lucebox doctor`'s list with --gpus, or leave it out to use them all",
        )
    if known:
        chosen = [known[i] for i in gpus] if gpus else list(known.values())
        devices = tuple(
            DeviceBudget(g.index, g.name, g.vram_total_bytes, g.vram_free_bytes) for g in chosen
        )
        return pool_of(peers + devices, host_total)
    if peers:
        # No GPU here: the layers go to the peers, the CPU keeps the token embeddings.
        return pool_of(peers, host_total)
    memory = psutil.virtual_memory()
    return GpuBudget(
        "CPU (no NVIDIA GPU): system RAM", memory.total, memory.available, is_gpu=False
    )


def pool_of(devices: tuple[DeviceBudget, ...], host_total_bytes: int) -> GpuBudget:
    """One budget over ``devices``: their sums, named after them."""
    names = [d.label for d in devices]
    return GpuBudget(
        names[0] if len(names) == 1 else " + ".join(names),
        sum(d.vram_total_bytes for d in devices),
        sum(d.vram_free_bytes for d in devices),
        is_gpu=True,
        host_total_bytes=host_total_bytes,
        devices=devices,
    )


@dataclass(frozen=True)
class EngineView:
    """The engine a plan is made for: the installed one, or the pinned one not built yet."""

    id: str | None
    version: str
    server_path: str
    capabilities: EngineCapabilities

    @classmethod
    def of(cls, manifest: EngineManifest | None) -> EngineView:
        if manifest is None:
            return pinned_engine()
        return cls(manifest.id, manifest.version, manifest.server_path, manifest.capabilities)


def pinned_engine() -> EngineView:
    """The pinned engine's capabilities as recorded beside the pin (pin_capabilities.json)."""
    text = (
        resources.files("lucebox.engine.engines")
        .joinpath("pin_capabilities.json")
        .read_text("utf-8")
    )
    data = json.loads(text)
    caps = EngineCapabilities(
        spec_types=tuple(data["spec_types"]),
        kv_cache_types=tuple(data["kv_cache_types"]),
        model_archs=tuple(data["model_archs"]),
        swa_patterns={k: (int(v[0]), bool(v[1])) for k, v in data["swa_patterns"].items()},
    )
    return EngineView(None, data["version"], PLANNED_SERVER_PATH, caps)


# --- model files ------------------------------------------------------------------------------


def local_file(paths: Paths, source: str) -> Path | None:
    """The file behind a model source, when it is on disk (a path, or pulled into the store)."""
    parsed = parse_source(source)
    if parsed.kind == "path":
        return parsed.path if parsed.path and parsed.path.is_file() else None
    for record in list_models(paths):
        if record.source == source and record.main_path.is_file():
            return record.main_path
    return None


def planned_path(paths: Paths, source: str, file_name: str | None = None) -> Path:
    """Where the store keeps, or will keep, the file of ``source``."""
    found = local_file(paths, source)
    if found is not None:
        return found
    parsed = parse_source(source)
    files = paths.models_dir / "files"
    if parsed.kind == "hf":
        return files / parsed.repo_id.replace("/", "--") / Path(parsed.filename).name
    if parsed.kind == "pypi":
        return files / "pypi" / (file_name or f"{parsed.dist}.gguf")
    assert parsed.path is not None
    return parsed.path


@dataclass(frozen=True)
class ModelFile:
    """One model of the launch: where it is, what the planner knows, what the check said."""

    source: str
    path: Path
    present: bool
    facts: ModelFacts
    check: CheckResult | None
    """None when the file is not here yet (the plan used the preset's published facts)."""

    @property
    def info(self) -> ModelInfo | None:
        return self.check.info if self.check is not None else None

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "path": str(self.path),
            "present": self.present,
            "verdict": self.check.verdict if self.check else None,
            "problems": [p.__dict__ for p in self.check.problems] if self.check else [],
        }


def _facts(info: ModelInfo, engine: EngineView) -> ModelFacts:
    return facts_from_info(info, engine.capabilities.swa_patterns.get(info.architecture))


def _target_file(
    paths: Paths,
    source: str,
    preset: Preset | None,
    engine: EngineView,
    allow_base: bool,
) -> ModelFile:
    path = local_file(paths, source)
    if path is None:
        if preset is None:
            raise UsageError(
                f"{source} is not on disk yet, so its header cannot be read",
                hint=f"run `lucebox models pull {source}` first",
            )
        facts = facts_from_preset(preset.target, preset.native_ctx, preset.title)
        return ModelFile(
            source, planned_path(paths, source, preset.target.file_name), False, facts, None
        )
    template = bool(preset and preset.chat_template)
    check = check_model(
        path,
        allow_base=allow_base or template,
        template_supplied=template,
        known_archs=engine.capabilities.model_archs,
    )
    if check.info is not None:
        facts = _facts(check.info, engine)
    elif preset is not None:
        facts = facts_from_preset(preset.target, preset.native_ctx, preset.title)
    else:
        raise refusal_of(check)
    return ModelFile(source, path, True, facts, check)


def _draft_file(
    paths: Paths,
    source: str,
    model: PresetModel | None,
    native_ctx: int,
    target: ModelFile,
    engine: EngineView,
) -> ModelFile:
    path = local_file(paths, source)
    if path is None:
        if model is None:
            raise UsageError(
                f"the draft {source} is not on disk yet, so its header cannot be read",
                hint=f"run `lucebox models pull {source}` first",
            )
        facts = facts_from_preset(model, native_ctx, "draft")
        return ModelFile(source, planned_path(paths, source, model.file_name), False, facts, None)
    if target.present:
        check, _ = check_pair(
            path,
            target.path,
            known_archs=engine.capabilities.model_archs,
            spec_types=engine.capabilities.spec_types,
        )
    else:
        check = check_model(path, known_archs=engine.capabilities.model_archs, instruct_guard=False)
    if check.info is None:
        facts = facts_from_preset(model, native_ctx, "draft") if model else target.facts
    else:
        facts = _facts(check.info, engine)
    return ModelFile(source, path, True, facts, check)


class PlanRefusal(GuardRefusal):
    """A launch plan that must not start; carries the plan so `plan` can still print it."""

    def __init__(self, launch: LaunchPlan, refusal: GuardRefusal) -> None:
        super().__init__(refusal.message, hint=refusal.hint, problem_codes=refusal.problem_codes)
        self.launch = launch


def slots_dir(paths: Paths) -> Path:
    """Where the engine saves a slot's prompt cache on stop, to restore it on the next start."""
    return paths.data_dir / "slots"


# --- the plan ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Speculation:
    spec_type: str | None
    draft: ModelFile | None
    draft_max: int | None
    p_min: float | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"type": self.spec_type, "draft_max": self.draft_max, "reason": self.reason}


@dataclass(frozen=True)
class LaunchPlan:
    """Everything a launch needs, decided once; ``argv`` is exactly what starts."""

    title: str
    alias: str
    preset: Preset | None
    budget: GpuBudget
    engine: EngineView
    target: ModelFile
    speculation: Speculation
    plan: Plan
    """The memory plan: context, KV types, offload and every memory term with its reason."""
    spec: LaunchSpec
    resolved: Resolved
    options: ServeOptions
    """What it was planned from: a re-plan changes only what it must."""
    ctx_cap: int | None = None
    """The bound an out-of-memory re-plan put on the context; later re-plans keep it."""
    refusal: GuardRefusal | None = None
    """Why this plan must not start (a refused file, a plan that does not fit)."""
    fit_check: dict[str, Any] | None = field(default=None, compare=False)
    engine_choice: EngineChoice | None = None
    """Which engine serves and why (None for a plan made before the choice existed)."""

    @property
    def argv(self) -> list[str]:
        return server_argv(self.spec)

    @property
    def command(self) -> str:
        """The command line, quoted so it pastes into a shell."""
        return shlex.join(self.argv)

    @property
    def misfit(self) -> str:
        """ "" when the set runs wholly on the device, else one word: offload or vram."""
        if not self.plan.fits:
            return "vram"
        if self.plan.n_gpu_layers >= 0 and self.plan.memory_bytes.cuda_context:
            return "offload"
        return ""

    @property
    def problems(self) -> tuple[Problem, ...]:
        found = self.target.check.problems if self.target.check else ()
        draft = self.speculation.draft
        return found + (draft.check.problems if draft and draft.check else ())

    def to_json(self) -> dict[str, Any]:
        """The document `plan --json` and `up/serve --dry-run --json` print."""
        return {
            **self.plan.to_json(),
            "fits": self.refusal is None,
            "model": self.title,
            "alias": self.alias,
            "preset": self.preset.id if self.preset else None,
            "device": self.budget.device,
            "devices": [{"name": n, "memory_bytes": b} for n, b in self.plan.device_bytes],
            "env": server_env(self.spec),
            "engine": {
                "id": self.engine.id,
                "version": self.engine.version,
                **(self.engine_choice.to_json() if self.engine_choice else {}),
            },
            "target": self.target.to_json(),
            "draft": self.speculation.draft.to_json() if self.speculation.draft else None,
            "spec": self.speculation.to_json(),
            "argv": self.argv,
            "command": self.command,
            "refusal": str(self.refusal) if self.refusal else None,
            "fit_check": self.fit_check,
        }


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
    wanted = min(plain.ctx, request.ctx or ENOUGH_CTX, request.target.native_ctx)
    passed: list[str] = []
    for candidate in found:
        extra = None
        if candidate.uses_draft_file and draft is not None:
            extra = draft.facts
        elif candidate.spec_type == "draft-mtp":
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
    wanted = min(request.ctx or ENOUGH_CTX, request.target.native_ctx)
    if with_full.fits and with_full.ctx >= wanted:
        return request
    return replace(request, swa_full=False)


def plan_launch(
    paths: Paths,
    options: ServeOptions,
    *,
    settings: Settings,
    budget: GpuBudget,
    engine: EngineView,
    preset: Preset | None = None,
    ctx_cap: int | None = None,
) -> LaunchPlan:
    """The launch for ``options`` on ``budget`` with ``engine``; reads headers, never fetches.

    ``preset`` is the model set already chosen (None with --model); ``ctx_cap`` bounds the
    context after an out-of-memory start. With several GPUs, a model that serves well on one
    of them runs there alone (a split costs speed); otherwise it is spread over all of them.
    Peers asked for with --rpc are always used: the user asked for the split.
    """

    def plan_on(devices: GpuBudget) -> LaunchPlan:
        return _plan_on_budget(
            paths, options, settings=settings, budget=devices, engine=engine, preset=preset,
            ctx_cap=ctx_cap,
        )  # fmt: skip

    pooled = plan_on(budget)
    if len(budget.devices) < 2 or any(d.address for d in budget.devices):
        return pooled
    wanted = min(pooled.resolved.ctx or ENOUGH_CTX, pooled.target.facts.native_ctx)
    for device in sorted(budget.devices, key=lambda d: -d.vram_free_bytes):
        alone = plan_on(pool_of((device,), budget.host_total_bytes))
        plan = alone.plan
        if (
            alone.refusal is None
            and plan.n_gpu_layers < 0
            and not plan.n_cpu_moe
            and plan.ctx >= wanted
        ):
            reasons = {**plan.reasons, "split": f"fits on {alone.budget.device} alone: no split"}
            return replace(alone, plan=replace(plan, reasons=reasons))
    return pooled


def _plan_on_budget(
    paths: Paths,
    options: ServeOptions,
    *,
    settings: Settings,
    budget: GpuBudget,
    engine: EngineView,
    preset: Preset | None,
    ctx_cap: int | None,
) -> LaunchPlan:
    resolved = resolve(options, settings)
    if options.model:
        target_source = options.model
    elif preset is not None:
        target_source = preset.target.source
    else:
        raise UsageError("nothing to plan", hint="name a --preset or a --model")
    target = _target_file(paths, target_source, preset, engine, resolved.allow_base)
    draft = None
    draft_source = options.draft
    preset_draft_model = preset.draft.model if preset and preset.draft else None
    if draft_source is None and preset_draft_model is not None:
        draft_source = preset_draft_model.source
    if draft_source is not None:
        native = preset.native_ctx if preset else target.facts.native_ctx
        model = (
            preset_draft_model
            if draft_source == (preset_draft_model.source if preset_draft_model else None)
            else None
        )
        draft = _draft_file(paths, draft_source, model, native, target, engine)

    swa_full = resolved.cache == "agent" and target.facts.swa_kv_elems_per_token > 0
    request = PlanRequest(
        target=target.facts,
        budget=budget,
        ctx=resolved.ctx,
        kv_types=engine.capabilities.kv_cache_types or KV_PAIRS,
        ctx_cap=ctx_cap,
        swa_full=swa_full,
        prompt_cache=resolved.cache == "agent",
        checkpoints=resolved.cache == "agent"
        and (target.facts.recurrent_state_bytes > 0 or target.facts.swa_kv_elems_per_token > 0),
    )
    if swa_full:
        request = _weigh_swa_full(request)
    from lucebox.engine.plan import luceboxroute  # it builds this module's LaunchPlan

    llama_plan = make_plan(request) if resolved.ctx and resolved.engine == "auto" else None
    choice = luceboxroute.choose(resolved, target, draft, budget, llama_plan, preset)
    if choice.kind == "lucebox":
        return luceboxroute.lucebox_launch(
            paths, options, resolved=resolved, target=target, draft=draft, budget=budget,
            preset=preset, choice=choice, ctx_cap=ctx_cap,
        )  # fmt: skip
    files = _spec_files(target, draft, preset)
    spec_types = engine.capabilities.spec_types
    found = speculation.candidates(files, spec_types)
    cpu_note = ""
    if resolved.spec == "auto":
        found, cpu_note = speculation.for_backend(
            found, budget.is_gpu, user_draft=options.draft is not None
        )
    allowed = speculation.for_mode(found, resolved.spec)
    refusal: GuardRefusal | None = None
    if resolved.spec not in ("auto", "off") and not allowed:
        refusal = GuardRefusal(
            speculation.unavailable_reason(files, resolved.spec, spec_types),
            hint="pass --spec auto to let lucebox choose, or --spec off",
        )
    chosen, memory, passed = _weigh(request, allowed, draft, resolved.spec)
    passed = [n for n in (cpu_note, speculation.tried_on_cpu(chosen, budget.is_gpu)) if n] + passed
    if chosen is not None and options.draft_max is not None:
        why = f"{chosen.why}; drafts shortened to {options.draft_max} tokens (low acceptance)"
        chosen = replace(chosen, draft_max=options.draft_max, why=why)
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
        on_gpu=budget.is_gpu,
        shortened=options.draft_max is not None,
    )
    reasons = {**memory.reasons, "spec": spec_choice.reason}
    memory = replace(memory, reasons=reasons)

    refusal = refusal or _refusal(target, memory)
    spec = LaunchSpec(
        server_path=engine.server_path,
        model_path=str(target.path),
        plan=memory,
        alias=preset.id if preset else target.path.stem,
        host=resolved.host,
        port=resolved.port,
        chat_template=preset.chat_template if preset else None,
        draft_path=str(spec_choice.draft.path) if spec_choice.draft else None,
        spec_type=spec_choice.spec_type,
        draft_max=spec_choice.draft_max,
        draft_p_min=spec_choice.p_min,
        api_key=resolved.api_key,
        # Beyond loopback (or with a key of the user's) the engine reads the key file that
        # prepare() writes; the path is known before the file exists.
        api_key_file=(
            str(api_key_path(paths)) if resolved.api_key or not is_loopback(resolved.host) else None
        ),
        sampling=tuple(sorted(preset.sampling.items())) if preset else (),
        slot_save_path=str(slots_dir(paths)) if resolved.cache == "agent" else None,
        gpus=tuple(d.index for d in budget.devices if not d.address) if budget.is_gpu else (),
        rpc=tuple(d.address for d in budget.devices if d.address),
    )
    return LaunchPlan(
        title=preset.title if preset else target.facts.name,
        alias=spec.alias,
        preset=preset,
        budget=budget,
        engine=engine,
        target=target,
        speculation=spec_choice,
        plan=memory,
        spec=spec,
        resolved=resolved,
        options=options,
        ctx_cap=ctx_cap,
        refusal=refusal,
        engine_choice=choice,
    )


def _speculation(
    chosen: speculation.SpecCandidate | None,
    draft: ModelFile | None,
    mode: SpecMode,
    passed: list[str],
    *,
    chosen_by: str,
    on_gpu: bool,
    shortened: bool,
) -> Speculation:
    """``chosen_by`` names where a mode the user chose comes from ("" under auto)."""
    tail = "; ".join(passed)
    if chosen is None:
        why = "off as asked" if mode == "off" else "none possible with these files and engine"
        return Speculation(None, None, None, None, "; ".join(filter(None, [why, tail])))
    warn = f" ({chosen_by})" if chosen_by else ""
    watch = specguard.describe(
        chosen.spec_type,
        chosen.draft_max,
        on_gpu,
        user_chose=bool(chosen_by),
        shortened=shortened,
    )
    return Speculation(
        chosen.spec_type,
        draft if chosen.uses_draft_file else None,
        chosen.draft_max,
        chosen.p_min,
        "; ".join(filter(None, [chosen.why + warn, watch, tail])),
    )


def _refusal(target: ModelFile, memory: Plan) -> GuardRefusal | None:
    if target.check is not None and not target.check.usable:
        return refusal_of(target.check)
    if not memory.fits:
        reason = memory.reasons.get("ctx") or memory.reasons.get("fits", "")
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
    draft_max: int | None = None,
) -> LaunchPlan:
    """``launch`` planned again (same options, files, card and engine) with a context bound, a
    shorter draft or another speculation mode: after an out-of-memory start, or when the
    speculation guard decides."""
    options = replace(
        launch.options,
        spec=spec or launch.options.spec,
        draft_max=draft_max if draft_max is not None else launch.options.draft_max,
    )
    return plan_launch(
        paths,
        options,
        settings=settings,
        budget=launch.budget,
        engine=launch.engine,
        preset=launch.preset,
        ctx_cap=ctx_cap or launch.ctx_cap,
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
