"""Which speculative decoding a launch uses (pure): the files, the engine, the user's choice.

In order of preference, each only when the engine has the type and the files pass the pairing
guard: MTP layers inside the target; a separate MTP / assistant draft; a DFlash / DSpark draft;
a small draft with the target's tokenizer; otherwise n-gram speculation, which needs no memory
and pays off when replies repeat their input (code edits). The chosen draft length follows the
mode and the family (upstream's measurements: Qwen3.6 27B gains most from 3-token MTP drafts
with p-min 0.75, the 35B-A3B MoE prefers p-min 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SpecMode = Literal["auto", "off", "mtp", "dflash", "draft", "ngram"]
SPEC_MODES: tuple[SpecMode, ...] = ("auto", "off", "mtp", "dflash", "draft", "ngram")

MODE_OF_TYPE: dict[str, SpecMode] = {
    "draft-mtp": "mtp",
    "draft-dflash": "dflash",
    "draft-dspark": "dflash",
    "draft-simple": "draft",
    "draft-eagle3": "draft",
    "ngram-mod": "ngram",
    "ngram-simple": "ngram",
    "ngram-map-k": "ngram",
    "ngram-map-k4v": "ngram",
    "ngram-cache": "ngram",
}
MTP_DRAFT_MAX = 3
MTP_P_MIN_DENSE = 0.75
DFLASH_DRAFT_MAX = 15
"""One less than the usual DFlash block of 16; the engine clamps to the draft's block size."""
SIMPLE_DRAFT_MAX = 8


@dataclass(frozen=True)
class SpecCandidate:
    """One way to speculate that the files allow, before memory is weighed."""

    spec_type: str
    uses_draft_file: bool
    draft_max: int | None
    p_min: float | None
    why: str


@dataclass(frozen=True)
class SpecFiles:
    """What the planner knows about the target and an optional draft, for this choice."""

    target_name: str
    target_has_mtp: bool
    target_is_moe: bool
    draft_name: str | None = None
    draft_type: str | None = None
    """The type the pairing guard found for the draft (draft-mtp, draft-dflash, ...)."""
    draft_problem: str | None = None
    """Why the pairing guard refused the draft, when it did."""
    preset_type: str | None = None
    """The type a preset names for its set (used when the files are not here to read)."""
    preset_draft_max: int | None = None


def candidates(files: SpecFiles, spec_types: tuple[str, ...]) -> list[SpecCandidate]:
    """Every speculation the files and the engine allow, best first."""
    found: list[SpecCandidate] = []
    p_min = 0.0 if files.target_is_moe else MTP_P_MIN_DENSE
    if files.target_has_mtp and "draft-mtp" in spec_types:
        found.append(
            SpecCandidate(
                "draft-mtp",
                False,
                MTP_DRAFT_MAX,
                p_min,
                f"{files.target_name} carries MTP layers: {MTP_DRAFT_MAX}-token drafts, "
                f"p-min {p_min:g} ({'MoE' if files.target_is_moe else 'dense'} model)",
            )
        )
    draft_type = files.draft_type
    if files.draft_name and draft_type and not files.draft_problem and draft_type in spec_types:
        draft_max = {
            "draft-mtp": MTP_DRAFT_MAX,
            "draft-dflash": DFLASH_DRAFT_MAX,
            "draft-dspark": DFLASH_DRAFT_MAX,
        }.get(draft_type, files.preset_draft_max or SIMPLE_DRAFT_MAX)
        found.append(
            SpecCandidate(
                draft_type,
                True,
                draft_max,
                p_min if draft_type == "draft-mtp" else None,
                f"draft {files.draft_name} ({draft_type}, {draft_max}-token drafts)",
            )
        )
    preset_type = files.preset_type
    if (
        preset_type
        and preset_type in spec_types
        and preset_type not in {c.spec_type for c in found}
        and (preset_type == "draft-mtp" or MODE_OF_TYPE.get(preset_type) == "ngram")
    ):
        found.append(
            SpecCandidate(
                preset_type,
                False,
                files.preset_draft_max or (MTP_DRAFT_MAX if preset_type == "draft-mtp" else None),
                p_min if preset_type == "draft-mtp" else None,
                f"the preset's {preset_type}",
            )
        )
    if "ngram-mod" in spec_types and "ngram-mod" not in {c.spec_type for c in found}:
        found.append(
            SpecCandidate(
                "ngram-mod",
                False,
                None,
                None,
                "n-gram speculation: no memory, pays off when replies repeat their input "
                "(code edits, agent tool output)",
            )
        )
    return found


CPU_LOSES = frozenset({"draft-mtp", "draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark"})
"""Model-drafted speculation on a CPU: verifying k+1 tokens costs nearly k+1 plain steps, so
these were slower than plain decoding even with every draft accepted, or needed 76-94% of
drafts to break even (benchmarks/spec_breakeven.py on the pinned engine)."""


def for_backend(
    found: list[SpecCandidate], on_gpu: bool, user_draft: bool = False
) -> tuple[list[SpecCandidate], str]:
    """The candidates worth trying on this backend, and why the others were left out.

    A draft file the user named (``user_draft``) is kept on a CPU too: they asked for that
    pairing, and the speculation guard stops it if it does not pay off on this machine.
    """
    if on_gpu:
        return found, ""
    kept = [c for c in found if c.spec_type not in CPU_LOSES or (user_draft and c.uses_draft_file)]
    left = sorted({c.spec_type for c in found if c not in kept})
    why = (
        f"not {', '.join(left)}: on a CPU, checking a draft costs nearly as much as decoding "
        "it, so they were slower than none even when every draft was accepted"
        if left
        else ""
    )
    return kept, why


def tried_on_cpu(chosen: SpecCandidate | None, on_gpu: bool) -> str:
    """A note when a draft the user named runs on a CPU, where drafts rarely pay off."""
    if on_gpu or chosen is None or not chosen.uses_draft_file:
        return ""
    return "the named draft is tried on a CPU, where drafts rarely pay off"


def for_mode(found: list[SpecCandidate], mode: SpecMode) -> list[SpecCandidate]:
    """The candidates a mode allows, best first (auto: all of them)."""
    if mode == "off":
        return []
    if mode == "auto":
        return found
    return [c for c in found if MODE_OF_TYPE.get(c.spec_type) == mode]


def unavailable_reason(files: SpecFiles, mode: SpecMode, spec_types: tuple[str, ...]) -> str:
    """Why ``mode`` cannot run with these files and this engine (for a refusal)."""
    if files.draft_problem:
        return f"the draft {files.draft_name} was refused: {files.draft_problem}"
    wanted = {
        "mtp": "MTP layers in the target, an mtp-* draft or a gemma4-assistant draft (--draft)",
        "dflash": "a DFlash or DSpark draft (--draft)",
        "draft": "a draft model with the target's tokenizer (--draft)",
        "ngram": "an engine with ngram-mod",
    }.get(mode, "")
    engine_has = [t for t in spec_types if MODE_OF_TYPE.get(t) == mode]
    if not engine_has:
        return f"the engine has no {mode} speculation: build a newer engine"
    return f"--spec {mode} needs {wanted}; {files.target_name} has none"
