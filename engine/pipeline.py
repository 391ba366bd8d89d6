"""The edges of planning: what the machine offers, what a model is, and the engine's view.

Each function does the I/O (NVML, headers, the store, running llama-fit-params) that the pure
planner needs done, so the CLI, ``lucebox serve`` and the TUI share one path.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil

from lucebox.engine.errors import GuardRefusal, UsageError
from lucebox.engine.gguf import GgufFormatError, ModelInfo, inspect_model
from lucebox.engine.gpu import GpuProbe
from lucebox.engine.paths import Paths
from lucebox.engine.plan import (
    GIB,
    KV_PAIRS,
    MIB,
    GpuBudget,
    ModelFacts,
    Plan,
    PlanRequest,
    facts_from_info,
    make_plan,
    read_swa_patterns,
)
from lucebox.engine.presets import (
    Preset,
    PresetModel,
    facts_from_preset,
    find_preset,
    load_presets,
)
from lucebox.engine.registry import EngineManifest
from lucebox.engine.source import default_source_dir
from lucebox.engine.store import list_models, parse_source

FIT_TIMEOUT_S = 120.0


def budget_for(probe: GpuProbe, gpu_index: int = 0, vram_mib: int | None = None) -> GpuBudget:
    """The memory a plan may use: a hypothetical card (--vram-mib), the GPU, or the RAM."""
    if vram_mib is not None:
        size = vram_mib * MIB
        return GpuBudget(f"a {vram_mib} MiB card", size, size, is_gpu=True)
    for gpu in probe.gpus:
        if gpu.index == gpu_index:
            return GpuBudget(
                f"GPU {gpu.index}: {gpu.name}",
                gpu.vram_total_bytes,
                gpu.vram_free_bytes,
                is_gpu=True,
            )
    if probe.gpus:
        raise UsageError(
            f"there is no GPU {gpu_index}",
            hint=f"GPUs: {', '.join(str(g.index) for g in probe.gpus)}",
        )
    memory = psutil.virtual_memory()
    return GpuBudget(
        "CPU (no NVIDIA GPU): system RAM", memory.total, memory.available, is_gpu=False
    )


def local_file(paths: Paths, source: str) -> Path | None:
    """The file behind a model source, when it is on disk (a path, or pulled into the store)."""
    parsed = parse_source(source)
    if parsed.kind == "path":
        return parsed.path if parsed.path and parsed.path.is_file() else None
    for record in list_models(paths):
        if record.source == source and record.main_path.is_file():
            return record.main_path
    return None


def facts_for(
    paths: Paths,
    path: Path,
    engine: EngineManifest | None = None,
    info: ModelInfo | None = None,
) -> ModelFacts:
    """Planner facts from a file's header (``info`` when it was read already), with the
    engine's sliding-window patterns (from its manifest, else from the engine source)."""
    if info is None:
        try:
            info = inspect_model(path)
        except (GgufFormatError, OSError) as exc:
            raise GuardRefusal(
                f"cannot plan {path}: {exc}", hint=f"run `lucebox models check {path}`"
            ) from exc
    patterns = engine.capabilities.swa_patterns if engine is not None else {}
    if not patterns:
        source_dir = default_source_dir(paths)
        patterns = read_swa_patterns(source_dir) if source_dir.is_dir() else {}
    return facts_from_info(info, patterns.get(info.architecture))


def model_facts(
    paths: Paths,
    model: PresetModel,
    native_ctx: int,
    name: str,
    engine: EngineManifest | None = None,
) -> ModelFacts:
    """From the header when the file is present, else from the preset's published facts."""
    path = local_file(paths, model.source)
    if path is not None:
        return facts_for(paths, path, engine)
    return facts_from_preset(model, native_ctx, name)


@dataclass(frozen=True)
class FitCheck:
    """llama-fit-params' own estimate for a plan, in MiB, and how far the plan is from it."""

    device: str
    model_mib: int
    context_mib: int
    compute_mib: int
    difference_percent: float
    """(plan weights + kv + compute) against the engine's estimate."""


def fit_check(engine: EngineManifest, model_path: Path, plan: Plan) -> FitCheck | None:
    """Ask the built engine's llama-fit-params for its estimate of the same settings."""
    tool = Path(engine.server_path).with_name("llama-fit-params")
    if not tool.is_file():
        return None
    argv = [str(tool), "-m", str(model_path), "--fit-print", "on", *plan.server_flags()]
    argv = [a for a in argv if a not in ("--fit", "off")]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=FIT_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [
        line.split()
        for line in done.stdout.splitlines()
        if re.match(r"^\S+( \d+){3}\s*$", line.strip())
    ]
    if not rows:
        return None
    device_rows = [r for r in rows if r[0] != "Host"] or rows
    model_mib, context_mib, compute_mib = (sum(int(r[i]) for r in device_rows) for i in (1, 2, 3))
    engine_total = (model_mib + context_mib + compute_mib) * MIB
    memory = plan.memory_bytes
    ours = memory.weights + memory.kv + memory.compute
    return FitCheck(
        device=",".join(r[0] for r in device_rows),
        model_mib=model_mib,
        context_mib=context_mib,
        compute_mib=compute_mib,
        difference_percent=round(100 * (ours - engine_total) / max(engine_total, 1), 1),
    )


@dataclass(frozen=True)
class PresetPlan:
    preset: Preset
    plan: Plan
    target: ModelFacts
    draft: ModelFacts | None

    @property
    def misfit(self) -> str:
        """ "" when the set runs wholly on the device, else one word: offload or vram."""
        if not self.plan.fits:
            return "vram"
        if self.plan.n_gpu_layers >= 0 and self.plan.memory_bytes.cuda_context:
            return "offload"
        return ""


GOOD_CTX = 8192
"""A preset is a candidate for `lucebox up` when it fits with at least this much context."""


def plan_preset(
    paths: Paths,
    preset: Preset,
    budget: GpuBudget,
    *,
    ctx: int | None = None,
    engine: EngineManifest | None = None,
) -> PresetPlan:
    target = model_facts(paths, preset.target, preset.native_ctx, preset.title, engine)
    draft = None
    if preset.draft is not None and preset.draft.model is not None:
        draft = model_facts(paths, preset.draft.model, preset.native_ctx, "draft", engine)
    kv_types = engine.capabilities.kv_cache_types if engine is not None else KV_PAIRS
    request = PlanRequest(
        target=target, budget=budget, draft=draft, ctx=ctx, kv_types=kv_types or KV_PAIRS
    )
    return PresetPlan(preset, make_plan(request), target, draft)


def choose_preset(plans: list[PresetPlan], budget: GpuBudget) -> PresetPlan | None:
    """The best model set that fits: the largest tier the card is made for, with a useful
    context. Without a GPU it is the CPU default: larger models on a CPU are too slow to enjoy.
    """
    card_gib = round(budget.total_bytes / GIB)
    useful = [
        p
        for p in plans
        if budget.is_gpu
        and not p.misfit
        and not p.preset.smoke_test
        and p.preset.vram_tier_gib <= card_gib
        and p.plan.ctx >= min(GOOD_CTX, p.target.native_ctx)
    ]
    if useful:
        return max(useful, key=lambda p: (p.preset.vram_tier_gib, p.plan.ctx))
    # No GPU worth using: the small instruct model made for CPUs, else the smoke test.
    fallback = [p for p in plans if p.plan.fits and (p.preset.cpu_default or p.preset.smoke_test)]
    return min(fallback, key=lambda p: not p.preset.cpu_default, default=None)


@dataclass(frozen=True)
class PresetTable:
    """Every preset planned for one budget, and the one `lucebox up` would pick."""

    budget: GpuBudget
    plans: tuple[PresetPlan, ...]
    best: PresetPlan | None


def preset_table(paths: Paths, budget: GpuBudget) -> PresetTable:
    plans = tuple(plan_preset(paths, p, budget) for p in load_presets(paths))
    return PresetTable(budget, plans, choose_preset(list(plans), budget))


def pick_preset(
    paths: Paths,
    budget: GpuBudget,
    preset_id: str | None,
    *,
    ctx: int | None = None,
    engine: EngineManifest | None = None,
) -> PresetPlan:
    """The named preset, or the best one for ``budget``, planned; refuses when none fits."""
    if preset_id:
        return plan_preset(paths, find_preset(paths, preset_id), budget, ctx=ctx, engine=engine)
    plans = [plan_preset(paths, p, budget, ctx=ctx, engine=engine) for p in load_presets(paths)]
    best = choose_preset(plans, budget)
    if best is None:
        raise GuardRefusal(
            f"no preset fits {budget.device}",
            hint="see `lucebox presets` for what each needs, or pass --model",
        )
    return best


def plan_model(
    target: ModelFacts,
    budget: GpuBudget,
    ctx: int | None,
    engine: EngineManifest | None,
) -> Plan:
    """Plan one model (no preset) with the KV types the engine has."""
    kv_types = engine.capabilities.kv_cache_types if engine is not None else KV_PAIRS
    return make_plan(
        PlanRequest(target=target, budget=budget, ctx=ctx, kv_types=kv_types or KV_PAIRS)
    )
