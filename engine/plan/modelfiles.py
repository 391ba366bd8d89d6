"""The model files of a launch: where each is (or will be), what its header or preset says,
and what the model checks found."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lucebox.engine.core.errors import GuardRefusal, UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.models.checkresult import CheckResult
from lucebox.engine.models.checkresult import refusal as refusal_of
from lucebox.engine.models.guard import check_model, check_pair
from lucebox.engine.models.headerinfo import ModelInfo
from lucebox.engine.models.modelfacts import ModelFacts, facts_from_info
from lucebox.engine.models.modelsource import parse_source
from lucebox.engine.models.presets import (
    Preset,
    PresetModel,
    PresetProjector,
    facts_from_preset,
)
from lucebox.engine.models.projector import ProjectorInfo, read_projector, stand_in_projector
from lucebox.engine.models.records import stored_file, stored_path
from lucebox.engine.plan.engineview import EngineView
from lucebox.engine.plan.options import Resolved, ServeOptions


def local_file(paths: Paths, source: str) -> Path | None:
    """The file behind a model source, when it is on disk (a path, or pulled into the store)."""
    return stored_file(paths, parse_source(source))


def _not_here_yet(paths: Paths, source: str, model: PresetModel | None, role: str) -> Path:
    """Where the store will keep a file not pulled yet; only a preset's file can be planned
    before its header is here (from the preset's published facts)."""
    if model is None:
        raise UsageError(
            f"{role}{source} is not on disk yet, so its header cannot be read",
            hint=f"run `lucebox models pull {source}` first",
        )
    return stored_path(paths, parse_source(source), model.file_name)


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


def target_file(
    paths: Paths,
    source: str,
    preset: Preset | None,
    engine: EngineView,
    allow_base: bool,
    remote_facts: ModelFacts | None = None,
) -> ModelFile:
    """The served model: its header's facts and the model check, or the preset's facts (or,
    for a quant of a repo named by name not pulled yet, ``remote_facts`` read from the Hub)."""
    parsed = parse_source(source)
    path = stored_file(paths, parsed)
    if path is None and remote_facts is not None:
        return ModelFile(source, stored_path(paths, parsed), False, remote_facts, None)
    if path is None:
        planned = _not_here_yet(paths, source, preset.target if preset else None, "")
        assert preset is not None
        facts = facts_from_preset(preset.target, preset.native_ctx, preset.title)
        return ModelFile(source, planned, False, facts, None)
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


def draft_file(
    paths: Paths,
    source: str,
    model: PresetModel | None,
    native_ctx: int,
    target: ModelFile,
    engine: EngineView,
) -> ModelFile:
    """A speculative draft, checked against the target when both are here."""
    path = local_file(paths, source)
    if path is None:
        planned = _not_here_yet(paths, source, model, "the draft ")
        assert model is not None
        return ModelFile(
            source, planned, False, facts_from_preset(model, native_ctx, "draft"), None
        )
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


def launch_files(
    paths: Paths,
    options: ServeOptions,
    preset: Preset | None,
    engine: EngineView,
    allow_base: bool,
    remote_facts: ModelFacts | None = None,
) -> tuple[ModelFile, ModelFile | None]:
    """The target and draft of a launch: the ones named with --model/--draft, else the
    preset's (a draft given with --draft replaces the preset's)."""
    if options.model:
        target_source = options.model
    elif preset is not None:
        target_source = preset.target.source
    else:
        raise UsageError("nothing to plan", hint="name a --preset or a --model")
    target = target_file(paths, target_source, preset, engine, allow_base, remote_facts)
    preset_draft = preset.draft.model if preset and preset.draft else None
    draft_source = options.draft or (preset_draft.source if preset_draft else None)
    if draft_source is None:
        return target, None
    native = preset.native_ctx if preset else target.facts.native_ctx
    model = preset_draft if preset_draft and draft_source == preset_draft.source else None
    return target, draft_file(paths, draft_source, model, native, target, engine)


def preset_projector(paths: Paths, projector: PresetProjector) -> tuple[ProjectorInfo | None, str]:
    """A preset's projector at the path the store keeps (or will keep) it: its header read from
    disk once pulled, else planned from the preset's own size and type (the network is never
    asked: only a pull fetches it); None and why when the file here is not a projector."""
    parsed = projector.model_source
    where = stored_file(paths, parsed) or stored_path(paths, parsed)
    if where.is_file():
        info = read_projector(where)
        return info, "" if info else f"{where.name} is not a vision projector"
    size = "estimated in the preset" if projector.size_is_estimate else "from the preset"
    why = (
        f"its size {size} and a conservative {projector.projector_type} image shape until the "
        "file is pulled and its header read"
    )
    return stand_in_projector(where, projector.projector_type, projector.size_bytes, why), ""


@dataclass(frozen=True)
class PresetVision:
    """The projectors a preset's plan weighs, where each is pulled from, why the preset's was
    not weighed ("" when it was), and the refusal of --vision on when it cannot be."""

    projectors: tuple[ProjectorInfo, ...] = ()
    sources: tuple[tuple[str, str], ...] = ()
    """(planned path, source) of each projector."""
    unplanned: str = ""
    refusal: GuardRefusal | None = None

    def source_of(self, path: str) -> str | None:
        return dict(self.sources).get(path)


def preset_vision(paths: Paths, preset: Preset | None, resolved: Resolved) -> PresetVision:
    """What a launch of ``preset`` weighs for vision: its projector unless vision is off or
    --mmproj names another. `plan`, `up` and the preset table all start from it, so the table
    plans each preset with the projector its launch gets."""
    projector = preset.projector if preset else None
    if projector is None or resolved.vision == "off" or resolved.mmproj:
        return PresetVision()
    found, why = preset_projector(paths, projector)
    if found is None:
        hint = "pass --mmproj PATH (the model's mmproj GGUF), or --vision off"
        if resolved.vision == "on":
            refusal = GuardRefusal(f"vision is on ({resolved.vision_from}) but {why}", hint=hint)
            return PresetVision(refusal=refusal)
        return PresetVision(unplanned=f"not served: {why}; {hint}")
    return PresetVision((found,), ((str(found.path), projector.source),))
