"""Models by short name: ``qwen3.6``, ``qwen3.6:27b``, ``gemma4:31b-q4_k_m``.

A name is a family with an optional tag (a size, a quant, or both: ``SIZE-QUANT``), as
Ollama's tags read. It names the shipped presets of that family (the plan then picks the one
for this card, as `up` picks among all of them), or, where a preset matches by size but not by
quant, the preset's repo at that quant; a family no preset has is looked up on the Hub (the
most downloaded GGUF repo whose name matches). Full sources (``OWNER/REPO``, ``hf:``,
``pypi:``, a path) are not names: they go to :mod:`modelsource` as they are.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from lucebox.engine.core.errors import UsageError
from lucebox.engine.models.presets import Preset
from lucebox.engine.models.quant import quant_from_name

_NAME = re.compile(r"^(?P<family>[a-z0-9][a-z0-9._-]*?)(?::(?P<tag>[a-z0-9._-]+))?$", re.I)
_SIZE = re.compile(r"(?<![a-z0-9])(\d+(?:\.\d+)?[bm](?:-a\d+(?:\.\d+)?b)?)(?![a-z0-9])", re.I)
_FULL_PREFIXES = ("hf:", "hf.co/", "pypi:")


class ModelNameError(UsageError):
    """A short name that does not name one model: unknown, or several families."""


@dataclass(frozen=True)
class ShortName:
    text: str
    family: str
    size: str | None
    """``27b``, ``35b-a3b``; None: any size."""
    quant: str | None
    """Upper-cased as quant labels are (``Q4_K_M``); None: the plan chooses."""


@dataclass(frozen=True)
class NameMatch:
    """What a short name resolved to, and why (printed for the user)."""

    name: ShortName
    preset_ids: tuple[str, ...] = ()
    """The presets it names; the plan picks the best of them for the card."""
    source: str | None = None
    """A repo by name when no preset matches (its quant: ``quant``)."""
    quant: str | None = None
    why: str = ""


def is_short_name(text: str) -> bool:
    """Whether ``text`` is a short name rather than a full source (a repo, hf:, pypi:, path)."""
    if text.startswith(_FULL_PREFIXES) or "/" in text or text.lower().endswith(".gguf"):
        return False
    return _NAME.match(text) is not None and not Path(text).expanduser().exists()


def parse_name(text: str) -> ShortName:
    match = _NAME.match(text)
    if match is None:
        raise ModelNameError(
            f"'{text}' is not a model name",
            hint="name a family with an optional tag (qwen3.6, qwen3.6:27b, "
            "gemma4:31b-q4_k_m), or a repo as OWNER/REPO",
        )
    size, quant = _tag_parts(text, match["tag"] or "")
    return ShortName(text, match["family"].lower(), size, quant)


def _tag_parts(text: str, tag: str) -> tuple[str | None, str | None]:
    size_match = _SIZE.match(tag)
    size = size_match.group(1).lower() if size_match else None
    rest = tag[size_match.end() :].lstrip("-") if size_match else tag
    quant = quant_from_name(rest) if rest else None
    if rest and (quant is None or quant.lower() != rest.lower()):
        raise ModelNameError(
            f"the tag of '{text}' is not a size or a quant: '{rest}'",
            hint="a tag is SIZE, QUANT or SIZE-QUANT, e.g. :27b, :q4_k_m, :31b-q4_k_m",
        )
    return size, quant


def preset_size(preset: Preset) -> str | None:
    """The size a preset's id names (``qwen3.6-27b-iq3`` is 27b)."""
    found = _SIZE.search(preset.id.removeprefix(preset.family))
    return found.group(1).lower() if found else None


def preset_quant(preset: Preset) -> str | None:
    return quant_from_name(preset.target.source)


def _same_quant(asked: str, label: str | None) -> bool:
    return label is not None and label.removeprefix("UD-") == asked.removeprefix("UD-")


def _families(presets: Sequence[Preset], family: str) -> list[str]:
    """The families ``family`` names: itself, spelled without dots, or the one it begins."""
    known = sorted({p.family for p in presets})
    exact = [f for f in known if family in (f, f.replace(".", ""))]
    return exact or [f for f in known if f.startswith(family)]


SearchHub = Callable[[str], Sequence[str]]
"""Repo ids on the Hub whose name matches the text, the most downloaded first."""


def match_name(text: str, presets: Sequence[Preset], search_hub: SearchHub) -> NameMatch:
    """What ``text`` names: presets by id or family (and tag), else a repo on the Hub."""
    named = [p for p in presets if p.id == text.lower()]
    name = parse_name(text)
    if named:
        return NameMatch(name, (named[0].id,), why=f"'{text}' is the preset {named[0].id}")
    usable = [p for p in presets if not p.smoke_test]
    families = _families(usable, name.family)
    if len(families) > 1:
        listed = "; ".join(
            f"{f}: {', '.join(p.id for p in usable if p.family == f)}" for f in families
        )
        raise ModelNameError(
            f"'{text}' names several families ({listed})",
            hint=f"name one of them, e.g. `lucebox up {families[0]}`",
        )
    if families:
        found = _preset_match(name, [p for p in usable if p.family == families[0]])
        if found is not None:
            return found
    return _hub_match(name, search_hub)


def _preset_match(name: ShortName, family: list[Preset]) -> NameMatch | None:
    sized = [p for p in family if name.size is None or preset_size(p) == name.size]
    if not sized:
        return None
    quanted = [p for p in sized if name.quant is None or _same_quant(name.quant, preset_quant(p))]
    ids = tuple(p.id for p in quanted)
    if quanted:
        chosen = "the preset" if len(ids) == 1 else "the presets"
        tail = "" if len(ids) == 1 else "; the plan picks the one for this card"
        return NameMatch(name, ids, why=f"'{name.text}' names {chosen} {', '.join(ids)}{tail}")
    repos = [_repo_of(p) for p in sized]
    repo = next((r for r in repos if r), None)
    if repo is None or name.quant is None:
        return None
    have = ", ".join(sorted({q for p in sized if (q := preset_quant(p))}))
    return NameMatch(
        name,
        source=repo,
        quant=name.quant,
        why=f"'{name.text}': no preset is {name.quant} (they are {have}); its repo {repo} "
        f"at {name.quant}",
    )


def _repo_of(preset: Preset) -> str | None:
    parsed = preset.target.model_source
    return parsed.repo_id if parsed.kind in ("hf", "repo") else None


def _search_texts(family: str) -> list[str]:
    """The family as typed, then with a hyphen where letters meet digits: short names drop it
    (``llama3.2``) where repo names keep it (``Llama-3.2-1B-Instruct-GGUF``)."""
    hyphened = re.sub(r"(?<=[a-z])(?=\d)", "-", family)
    return [family] if hyphened == family else [family, hyphened]


def _hub_match(name: ShortName, search_hub: SearchHub) -> NameMatch:
    hits: list[str] = []
    for text in _search_texts(name.family):
        hits = [
            repo
            for repo in search_hub(text)
            if name.size is None or name.size in repo.lower().replace("_", "-")
        ]
        if hits:
            break
    if not hits:
        sized = f" of size {name.size}" if name.size else ""
        raise ModelNameError(
            f"no preset or GGUF repo on the Hub is named '{name.family}'{sized}",
            hint=f"`lucebox presets` lists the presets; `lucebox models search {name.family}` "
            "finds repos to name as OWNER/REPO",
        )
    return NameMatch(
        name,
        source=hits[0],
        quant=name.quant,
        why=f"'{name.text}' is no preset; {hits[0]}, the most downloaded GGUF repo on the Hub "
        f"matching '{name.family}'" + (f" with {name.size}" if name.size else ""),
    )
