"""Presets: model sets as TOML files (``presets/*.toml``), validated against one schema.

A preset names a target model (and optionally a draft) by source, with the facts the planner
needs before anything is downloaded (size, layers, KV heads, ...) and the evidence they come
from. Once the files are present, plans use their real headers instead. Users may add their
own presets in ``<config>/presets/``; a bad file names the file, the key and the problem.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from lucebox.engine.core.errors import UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.models.modelfacts import ModelFacts
from lucebox.engine.models.modelsource import ModelSource, parse_source
from lucebox.engine.models.projector import STAND_IN_SHAPES

SPEC_TYPES_NEEDING_DRAFT = {"draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark"}
LUCEBOX_PRESET_ENGINE = "lucebox"
PRESET_ENGINES = ("llama.cpp", LUCEBOX_PRESET_ENGINE)
"""What a preset is made for. A Lucebox-engine variant is a preset of its own (its own id, a
plain target and a Lucebox draft) rather than a table inside the llama-server row: every
surface that lists presets (the table, ``presets --json``, the TUI, ``plan --preset``) then
shows it as one planned row with its own fit and context, and ``--preset`` names either."""


class PresetError(UsageError):
    """A preset file is malformed; the message names the file and the key."""


@dataclass(frozen=True)
class PresetFacts:
    architecture: str
    n_layer: int
    n_embd: int
    n_vocab: int
    full_kv_layers: int
    kv_heads: int
    head_dim: int
    swa_kv_layers: int = 0
    swa_window: int = 0
    swa_kv_heads: int = 0
    swa_head_dim: int = 0
    """Sliding-window layers' KV heads and head size where they differ (0: as the others)."""
    recurrent_layers: int = 0
    recurrent_state_bytes_per_layer: int = 0
    expert_share: float = 0.0
    """Share of the file in MoE expert tensors (what --n-cpu-moe can keep on the CPU)."""


@dataclass(frozen=True)
class _FromSource:
    source: str

    @functools.cached_property
    def model_source(self) -> ModelSource:
        """``source`` parsed, once: when the preset is read (a malformed one refuses it)."""
        return parse_source(self.source)


@dataclass(frozen=True)
class PresetModel(_FromSource):
    size_bytes: int
    size_is_estimate: bool
    facts: PresetFacts
    base_model: bool = False
    file_name: str | None = None
    """The GGUF's name inside a PyPI package, so a plan can name the path before a pull."""


@dataclass(frozen=True)
class PresetProjector(_FromSource):
    """A vision model's projector (its ``mmproj-*.gguf``), sized so a plan can count it
    before the pull."""

    projector_type: str
    """Its ``clip.projector_type``: the image shape planned until its header is read."""
    size_bytes: int
    size_is_estimate: bool


@dataclass(frozen=True)
class PresetDraft:
    model: PresetModel | None
    """None for draftless speculation (n-gram, or the target's own MTP layers)."""
    spec_type: str
    draft_max: int | None
    reported_speedup: float | None = None
    """The decode gain the pair's publisher measured with this draft (cited in the evidence):
    it ranks Lucebox-engine sets within a tier, where KVFlash gives each one long contexts and
    context no longer tells them apart."""


@dataclass(frozen=True)
class Preset:
    id: str
    title: str
    family: str
    vram_tier_gib: int
    engine: str
    native_ctx: int
    evidence: str
    target: PresetModel
    draft: PresetDraft | None
    chat_template: str | None
    sampling: dict[str, float]
    smoke_test: bool
    path: str
    cpu_default: bool = False
    """The set `lucebox up` picks when there is no usable GPU (a small instruct model)."""
    projector: PresetProjector | None = None
    """None for a text-only model."""


_TOP = {
    "id": str,
    "title": str,
    "family": str,
    "vram_tier_gib": int,
    "engine": str,
    "native_ctx": int,
    "evidence": str,
}
_FACTS = {
    "architecture": str,
    "n_layer": int,
    "n_embd": int,
    "n_vocab": int,
    "full_kv_layers": int,
    "kv_heads": int,
    "head_dim": int,
}
_OPTIONAL_FACTS: dict[str, type] = {
    "swa_kv_layers": int,
    "swa_window": int,
    "swa_kv_heads": int,
    "swa_head_dim": int,
    "recurrent_layers": int,
    "recurrent_state_bytes_per_layer": int,
    "expert_share": float,
}
_PROJECTOR = {"source": str, "projector_type": str, "size_bytes": int, "size_is_estimate": bool}
_KNOWN_TOP = set(_TOP) | {
    "smoke_test",
    "cpu_default",
    "chat_template",
    "target",
    "projector",
    "draft",
    "facts",
    "speculative",
    "sampling",
}


def _get(table: dict[str, Any], key: str, kind: type, where: str, required: bool = True) -> Any:
    if key not in table:
        if required:
            raise PresetError(f"{where}: missing key '{key}'")
        return None
    value = table[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if type(value) is not kind:
        raise PresetError(f"{where}: '{key}' should be {kind.__name__}, found {value!r}")
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        raise PresetError(f"{where}: '{key}' must not be negative")
    return value


def _facts(table: Any, where: str) -> PresetFacts:
    if not isinstance(table, dict):
        raise PresetError(f"{where}: missing table [facts]")
    values = {k: _get(table, k, t, where) for k, t in _FACTS.items()}
    values |= {
        k: _get(table, k, t, where, required=False) or t() for k, t in _OPTIONAL_FACTS.items()
    }
    unknown = set(table) - set(_FACTS) - set(_OPTIONAL_FACTS)
    if unknown:
        raise PresetError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    if (values["swa_kv_heads"] or values["swa_head_dim"]) and not values["swa_kv_layers"]:
        raise PresetError(f"{where}: 'swa_kv_heads' and 'swa_head_dim' need 'swa_kv_layers'")
    if not 0 <= values["expert_share"] < 1:
        raise PresetError(f"{where}: 'expert_share' is a share of the file, from 0 to below 1")
    return PresetFacts(**values)


def _model(table: Any, facts: Any, where: str) -> PresetModel:
    if not isinstance(table, dict):
        raise PresetError(f"{where}: missing table")
    model = PresetModel(
        source=_get(table, "source", str, where),
        size_bytes=_get(table, "size_bytes", int, where),
        size_is_estimate=bool(_get(table, "size_is_estimate", bool, where, required=False)),
        facts=_facts(facts, f"{where} facts"),
        base_model=bool(_get(table, "base_model", bool, where, required=False)),
        file_name=_get(table, "file_name", str, where, required=False),
    )
    _checked_source(model, where)
    return model


def _checked_source(item: _FromSource, where: str) -> ModelSource:
    """``item``'s source, parsed now and kept parsed; a malformed one refuses the preset."""
    try:
        return item.model_source
    except UsageError as exc:
        raise PresetError(f"{where}: {exc.message}", hint=exc.hint) from exc


def _projector(table: Any, where: str) -> PresetProjector | None:
    if table is None:
        return None
    if not isinstance(table, dict):
        raise PresetError(f"{where}: should be a table")
    unknown = set(table) - set(_PROJECTOR)
    if unknown:
        raise PresetError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    projector = PresetProjector(
        source=_get(table, "source", str, where),
        projector_type=_get(table, "projector_type", str, where),
        size_bytes=_get(table, "size_bytes", int, where),
        size_is_estimate=bool(_get(table, "size_is_estimate", bool, where, required=False)),
    )
    if _checked_source(projector, where).kind != "hf":
        raise PresetError(f"{where}: 'source' should name one GGUF file, hf:OWNER/REPO/FILE.gguf")
    if projector.projector_type not in STAND_IN_SHAPES:
        raise PresetError(
            f"{where}: projector_type {projector.projector_type!r} has no image shape to plan "
            "before the pull",
            hint=f"use one of {', '.join(sorted(STAND_IN_SHAPES))}",
        )
    return projector


def parse_preset(text: str, path: str) -> Preset:
    """Validate one preset file's text (pure; ``path`` only names it in errors)."""
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PresetError(f"{path} is not valid TOML: {exc}") from exc
    unknown = set(table) - _KNOWN_TOP
    if unknown:
        raise PresetError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    top = {k: _get(table, k, t, path) for k, t in _TOP.items()}
    if top["engine"] not in PRESET_ENGINES:
        raise PresetError(
            f"{path}: 'engine' should be one of {', '.join(PRESET_ENGINES)}, "
            f"found {top['engine']!r}"
        )
    target = _model(table.get("target"), table.get("facts"), f"{path} [target]")
    draft = None
    spec = table.get("speculative") or {}
    draft_table = table.get("draft")
    if draft_table is not None:
        model = _model(draft_table, draft_table.get("facts"), f"{path} [draft]")
        spec_type = _get(draft_table, "spec_type", str, f"{path} [draft]")
        where = f"{path} [draft]"
        draft = PresetDraft(
            model,
            spec_type,
            _get(draft_table, "draft_max", int, where, False),
            _get(draft_table, "reported_speedup", float, where, False),
        )
    elif spec:
        spec_type = _get(spec, "spec_type", str, f"{path} [speculative]")
        if spec_type in SPEC_TYPES_NEEDING_DRAFT:
            raise PresetError(f"{path} [speculative]: {spec_type} needs a [draft] model")
        draft = PresetDraft(None, spec_type, None)
    sampling = table.get("sampling") or {}
    return Preset(
        **top,
        target=target,
        draft=draft,
        chat_template=_get(table, "chat_template", str, path, required=False),
        sampling={k: _get(sampling, k, float, f"{path} [sampling]") for k in sampling},
        smoke_test=bool(_get(table, "smoke_test", bool, path, required=False)),
        path=path,
        cpu_default=bool(_get(table, "cpu_default", bool, path, required=False)),
        projector=_projector(table.get("projector"), f"{path} [projector]"),
    )


def _preset_files(paths: Paths) -> list[tuple[str, str]]:
    files = []
    for entry in sorted(resources.files("lucebox.presets").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            files.append((f"presets/{entry.name}", entry.read_text(encoding="utf-8")))
    user_dir = paths.config_dir / "presets"
    for path in sorted(user_dir.glob("*.toml")) if user_dir.is_dir() else []:
        files.append((str(path), path.read_text(encoding="utf-8")))
    return files


def load_presets(paths: Paths) -> list[Preset]:
    """Every preset, shipped and the user's; a duplicate id in the user's folder wins."""
    by_id: dict[str, Preset] = {}
    for name, text in _preset_files(paths):
        preset = parse_preset(text, name)
        by_id[preset.id] = preset
    return sorted(by_id.values(), key=lambda p: (p.vram_tier_gib, p.id))


def find_preset(paths: Paths, preset_id: str) -> Preset:
    presets = load_presets(paths)
    for preset in presets:
        if preset.id == preset_id:
            return preset
    raise UsageError(
        f"no preset '{preset_id}'", hint=f"known presets: {', '.join(p.id for p in presets)}"
    )


def facts_from_preset(model: PresetModel, native_ctx: int, name: str) -> ModelFacts:
    """Planner facts before download, from the preset's published numbers."""
    facts = model.facts
    # Per-layer weights: the file size less the embedding and output matrices, estimated at
    # the file's average bytes per weight.
    params_non_layer = 2 * facts.n_vocab * facts.n_embd
    params_layer = max(model.size_bytes * 8 // 5 - params_non_layer, 1)  # ~5 bits per weight
    layer_share = params_layer / (params_layer + params_non_layer)
    elems = facts.kv_heads * 2 * facts.head_dim
    swa_elems = (facts.swa_kv_heads or facts.kv_heads) * 2 * (facts.swa_head_dim or facts.head_dim)
    return ModelFacts(
        name=name,
        architecture=facts.architecture,
        weights_bytes=model.size_bytes,
        layer_bytes=int(model.size_bytes * layer_share),
        host_bytes=0,
        expert_bytes=int(model.size_bytes * facts.expert_share),
        n_layer=facts.n_layer,
        n_embd=facts.n_embd,
        n_vocab=facts.n_vocab,
        native_ctx=native_ctx,
        full_kv_elems_per_token=facts.full_kv_layers * elems,
        max_layer_kv_elems=elems if facts.full_kv_layers else 0,
        max_swa_layer_kv_elems=swa_elems if facts.swa_kv_layers else 0,
        swa_kv_elems_per_token=facts.swa_kv_layers * swa_elems,
        swa_window=facts.swa_window,
        recurrent_state_bytes=facts.recurrent_layers * facts.recurrent_state_bytes_per_layer,
        source="preset",
    )
