"""A model named by its repo (``OWNER/REPO[:QUANT]``): every quant planned by the one planner
for this machine, one chosen (quantchoice), and the pinned file the launch uses.

The repo is listed once and one header is read (the quants share the shapes); each quant's
facts are that header's, with the weights scaled to the quant's own file size.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lucebox.engine.core.errors import UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.machine.budget import GpuBudget
from lucebox.engine.models import hubrepo
from lucebox.engine.models.modelfacts import ModelFacts, facts_from_info
from lucebox.engine.models.modelsource import ModelSource, parse_source
from lucebox.engine.models.projector import ProjectorInfo, mismatch, precision_rank, projector_of
from lucebox.engine.models.quant import QuantGroup, bits_per_weight, quant_from_name
from lucebox.engine.models.records import StoreError, list_models, stored_file, stored_path
from lucebox.engine.plan import planner
from lucebox.engine.plan.engineview import Installs
from lucebox.engine.plan.options import Resolved, ServeOptions
from lucebox.engine.plan.sources import quantchoice
from lucebox.engine.plan.visionplan import ENGINE_WITH_PROJECTOR, Vision


@dataclass(frozen=True)
class RepoProjector:
    """A vision projector of the repo that matches the model: its pinned source and header."""

    source: str
    """``hf:OWNER/REPO/mmproj-....gguf@COMMIT``: what the pull fetches."""
    repo_path: str
    """Its path inside the repo."""
    info: ProjectorInfo
    """Its header, with the path the store keeps it at (or will, once pulled)."""


@dataclass(frozen=True)
class RepoChoice:
    """The file a repo named by name resolves to on this machine, and why."""

    source: str
    """The pinned file source: ``hf:OWNER/REPO/FILE.gguf@COMMIT``."""
    why: str
    facts: ModelFacts | None
    """The chosen quant's facts, for a plan made before the download (None: it is here)."""
    document: dict[str, Any]
    """The ``source`` key of ``plan --json``."""
    projectors: tuple[RepoProjector, ...] = ()
    """The repo's projectors that match the model, most precise first (none read with
    --vision off or a projector named by --mmproj)."""

    @property
    def projector_infos(self) -> tuple[ProjectorInfo, ...]:
        return tuple(p.info for p in self.projectors)

    def projector_source(self, path: str) -> str | None:
        """The pinned source of the projector planned at ``path``; None if not this repo's."""
        return next((p.source for p in self.projectors if str(p.info.path) == path), None)


def repo_projectors(
    paths: Paths, listing: hubrepo.RepoListing, source: ModelSource, width: int | None
) -> tuple[tuple[RepoProjector, ...], dict[str, str]]:
    """The repo's projectors whose header matches a model ``width`` wide (most precise first),
    each read by range requests, and why each other one was left out (by its path)."""
    matched: list[RepoProjector] = []
    left: dict[str, str] = {}
    for sidecar in listing.layout.sidecars:
        if sidecar.kind != "mmproj":
            continue
        pinned = f"hf:{listing.repo_id}/{sidecar.file.path}@{listing.revision}"
        parsed = parse_source(pinned)
        where = stored_file(paths, parsed) or stored_path(paths, parsed)
        try:
            header = hubrepo.read_file_header(listing, sidecar.file, source)
        except StoreError as exc:
            left[sidecar.file.path] = exc.message
            continue
        info = projector_of(header, where)
        why = mismatch(info, where, width)
        if why is not None or info is None:
            left[sidecar.file.path] = why or f"{where.name} is not a vision projector"
        else:
            matched.append(RepoProjector(pinned, sidecar.file.path, info))
    matched.sort(key=lambda p: precision_rank(p.info.path.name))
    return tuple(matched), left


def _sidecar_note(
    kind: str, path: str, projectors: tuple[RepoProjector, ...], left: dict[str, str]
) -> str:
    if kind != "mmproj":
        return _SIDECAR_NOTES[kind]
    if path in left:
        return f"not served: {left[path]}"
    found = next((p.info for p in projectors if p.repo_path == path), None)
    if found is None:
        return _SIDECAR_NOTES[kind]
    return (
        f"a vision projector of this model ({found.projector_type}, images to width "
        f"{found.out_width}): weighed by the plan (see vision)"
    )


def with_vision(document: dict[str, Any], vision: Vision) -> dict[str, Any]:
    """The ``source`` document with the projector the plan serves marked as served."""
    served = vision.projector.path.name if vision.served and vision.projector else None
    sidecars = [
        {**s, "served": s["kind"] == "mmproj" and Path(s["path"]).name == served}
        for s in document.get("sidecars", [])
    ]
    return {**document, "sidecars": sidecars}


def _document(
    listing: hubrepo.RepoListing,
    choice: quantchoice.QuantChoice,
    header_bytes_read: int,
    projectors: tuple[RepoProjector, ...] = (),
    left: dict[str, str] | None = None,
) -> dict[str, Any]:
    group = next(g for g in listing.layout.candidates if g.quant == choice.chosen.quant)
    return {
        "repo": listing.repo_id,
        "revision": listing.revision,
        "quant": choice.chosen.quant,
        "files": [
            {"path": f.path, "size_bytes": f.size_bytes, "sha256": f.sha256} for f in group.files
        ],
        "why": choice.why,
        "candidates": [c.to_json() for c in choice.candidates],
        "sidecars": [
            {
                "kind": s.kind,
                "path": s.file.path,
                "size_bytes": s.file.size_bytes,
                "served": False,
                "note": _sidecar_note(s.kind, s.file.path, projectors, left or {}),
            }
            for s in listing.layout.sidecars
        ],
        "skipped": list(listing.layout.skipped),
        "header_bytes_read": header_bytes_read,
    }


_SIDECAR_NOTES = {
    "mmproj": f"a vision projector: served with --mmproj PATH ({ENGINE_WITH_PROJECTOR})",
    "mtp": "an MTP head beside the quants: not served from a sidecar yet",
    "draft": "a draft model: pass it with --draft to use it",
}


def repo_source(text: str | None) -> ModelSource | None:
    """``text`` parsed, when it names a repo by name (the planner picks its quant); None for
    any other source. Parsed once: the source object is what the quant choice carries."""
    source = parse_source(text) if text else None
    return source if source is not None and source.kind == "repo" else None


def by_name(
    paths: Paths,
    options: ServeOptions,
    *,
    resolved: Resolved,
    budget: GpuBudget,
    installs: Installs,
) -> RepoChoice | None:
    """The quant choice when ``options.model`` names a repo; None for any other source."""
    source = repo_source(options.model)
    if source is None:
        if options.quant:
            raise UsageError(
                f"--quant {options.quant} needs a model named by its repo",
                hint="use --model OWNER/REPO --quant Q (a file or a preset has one quant)",
            )
        return None
    try:
        return choose_quant(
            paths, source, options, resolved=resolved, budget=budget, installs=installs
        )
    except hubrepo.HubUnreachableError:
        stored = _stored_pull(paths, source, _asked_quant(source, options.quant))
        if stored is None:
            raise
        return stored


def scaled_facts(base: ModelFacts, header: hubrepo.RemoteHeader, group: QuantGroup) -> ModelFacts:
    """``base`` (read from ``header``'s quant) with the weights of ``group``'s quant, from its
    file size less the header: every weight term scaled by the same ratio (the header's own
    quant too, so every candidate is weighed the same way)."""
    overhead = header.info.data_offset * len(group.files)
    weights = max(group.size_bytes - overhead, 1)
    ratio = weights / max(base.weights_bytes, 1)
    return replace(
        base,
        weights_bytes=weights,
        layer_bytes=int(base.layer_bytes * ratio),
        host_bytes=int(base.host_bytes * ratio),
        expert_bytes=int(base.expert_bytes * ratio),
    )


@dataclass(frozen=True)
class RepoCandidates:
    """Every quant of a repo as the planner sees it on one machine."""

    listing: hubrepo.RepoListing
    header: hubrepo.RemoteHeader
    candidates: tuple[quantchoice.Candidate, ...]
    facts_by_quant: dict[str, ModelFacts]
    native_ctx: int


def plan_quants(
    paths: Paths,
    source: ModelSource,
    options: ServeOptions,
    *,
    resolved: Resolved,
    budget: GpuBudget,
    installs: Installs,
) -> RepoCandidates:
    """List the repo ``source`` names, read one header, plan each quant on ``budget`` (the
    other choices from ``options``)."""
    listing = hubrepo.list_repo(source)
    header = hubrepo.read_header(listing, source)
    info = header.info
    base = facts_from_info(
        info, installs.llama_server.capabilities.swa_patterns.get(info.architecture)
    )
    candidates = []
    facts_by_quant: dict[str, ModelFacts] = {}
    for group in listing.layout.candidates:
        facts = scaled_facts(base, header, group)
        facts_by_quant[group.quant] = facts
        launch = planner.plan_launch(
            paths,
            replace(options, model=listing.source_for(group), quant=None),
            resolved=resolved,
            budget=budget,
            installs=installs,
            remote_facts=facts,
        )
        candidates.append(
            quantchoice.Candidate(
                quant=group.quant,
                source=listing.source_for(group),
                size_bytes=group.size_bytes,
                bits_per_weight=bits_per_weight(facts.weights_bytes, info.parameter_count),
                fits=launch.refusal is None,
                ctx=launch.plan.ctx,
                largest_ctx=launch.plan.largest_ctx,
                spec=launch.speculation.spec_type,
            )
        )
    return RepoCandidates(listing, header, tuple(candidates), facts_by_quant, base.native_ctx)


def choose_quant(
    paths: Paths,
    source: ModelSource,
    options: ServeOptions,
    *,
    resolved: Resolved,
    budget: GpuBudget,
    installs: Installs,
) -> RepoChoice:
    """Plan every quant of the repo ``source`` names on ``budget``; choose one."""
    asked = _asked_quant(source, options.quant)
    planned = plan_quants(
        paths, source, options, resolved=resolved, budget=budget, installs=installs
    )
    choice = quantchoice.choose(
        planned.candidates,
        planned.native_ctx,
        asked_quant=asked,
        asked_ctx=resolved.ctx,
    )
    projectors: tuple[RepoProjector, ...] = ()
    left: dict[str, str] = {}
    if resolved.vision != "off" and not resolved.mmproj:
        width = planned.header.info.embedding_length
        projectors, left = repo_projectors(paths, planned.listing, source, width)
    return RepoChoice(
        choice.chosen.source,
        choice.why,
        planned.facts_by_quant[choice.chosen.quant],
        _document(planned.listing, choice, planned.header.bytes_read, projectors, left),
        projectors,
    )


def _stored_pull(paths: Paths, source: ModelSource, quant: str | None) -> RepoChoice | None:
    """The newest pull of this repo in the store (of the named quant), for when the Hub cannot
    be reached: a service restarted without network still serves what it served."""
    prefix = f"hf:{source.repo_id}/"
    pulls = [
        r
        for r in list_models(paths)
        if r.source.startswith(prefix)
        and r.main_path.is_file()
        and (quant is None or quant_from_name(r.source) in (quant, f"UD-{quant}"))
    ]
    if not pulls:
        return None
    record = max(pulls, key=lambda r: r.verified_at)
    label = quant_from_name(record.source) or record.name
    why = f"{label}: the one pulled on {record.verified_at} (the Hub cannot be reached now)"
    document = {
        "repo": source.repo_id,
        "revision": record.revision,
        "quant": label,
        "files": [
            {"path": Path(f.path).name, "size_bytes": f.size_bytes, "sha256": f.sha256}
            for f in record.files
        ],
        "why": why,
        "candidates": [],
    }
    return RepoChoice(record.source, why, None, document)


def _asked_quant(source: ModelSource, flag: str | None) -> str | None:
    if source.quant and flag and source.quant.upper() != flag.upper():
        raise UsageError(
            f"{source.text} names the quant {source.quant}, and --quant asks for {flag}",
            hint="name the quant once",
        )
    return source.quant or flag
