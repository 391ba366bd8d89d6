"""Which speculative decoding a launch uses (pure): the files, the engine, the user's choice.

In order of preference, each only when the engine has the type and the files pass the pairing
guard: MTP layers inside the target; a separate MTP / assistant draft; a DFlash / DSpark draft;
a small draft with the target's tokenizer; otherwise n-gram speculation, which needs no memory
and pays off when replies repeat their input (code edits). The chosen draft length follows the
mode and the family (upstream's measurements: Qwen3.6 27B gains most from 3-token MTP drafts
with p-min 0.75, the 35B-A3B MoE prefers p-min 0).

**N-gram lookup combined with the model's draft** (issue 56) is one more candidate after the
single modes, offered where the engine has ``ngram-mod`` and a model draft (an MTP head or a
draft file) is planned. What the pinned engines do, read from their source:

- llama-server (b11434): ``--spec-type`` takes a comma-separated list and appends each type
  (common/arg.cpp:4273-4282), so ``--spec-type ngram-mod,draft-mtp`` enables both.
  ``common_speculative_init`` keeps one implementation per enabled type in a fixed priority,
  the draftless n-gram types first, then draft-simple, eagle3, mtp, dflash, dspark (the model
  drafts only with a draft context; common/speculative.cpp:2680-2707). Each step
  ``common_speculative_draft`` asks them in that order and stops at the first that returns a
  draft (common/speculative.cpp:2868-2956): n-gram lookup answers where the reply repeats
  the prompt and costs nothing where it has no match, the model drafts the rest. Each keeps
  its own length (ngram-mod's ``--spec-ngram-mod-n-max``, 64 by default; the model's
  ``--spec-draft-n-max``): the server caps a step's draft only by the context and reply left
  (tools/server/server-context.cpp:517-536, 3207-3240). Acceptance goes to the one that
  drafted (``impl_last``, common/speculative.cpp:2958-2990). An MTP context is loaded when any
  listed type is draft-mtp (common/common.cpp:1683); ``-md`` loads the draft file as for the
  single mode. Any n-gram type combines with any model type; lucebox plans ``ngram-mod`` (the
  one ``--spec-default`` picks, common/arg.cpp:4747-4761) before the planned model type.
- The Lucebox engine (``dflash_server``, both pinned revisions 62880e20 and 4cf58a04) has no
  prompt-lookup or n-gram speculation to combine: its options are a DFlash ``--draft`` and
  ``--ddtree`` / ``--ddtree-budget`` (server/src/server/server_main.cpp:233-236 at 62880e20,
  :113-115 at 4cf58a04). Its n-grams are elsewhere: PFlash's anchor scan picks prefill chunks
  by 4-gram matches (server/src/qwen3/anchor_scan.h:1-22, qwen3_drafter.cpp:580), and a
  watchdog ends a reply stuck in a repetition loop (server/src/common/model_backend.h:235-239).
  Tool-call hint tokens (server/src/server/tool_hint.h:22-57) feed its drafter, with no
  switch. So the combination is a llama-server mode only: the Lucebox engine's spec types
  (dflash, ddtree) have no ``ngram-mod``.

The combination is named by the engine's own list (``ngram-mod,draft-mtp``) in the plan,
``status`` and the measurement store, and shown as ``n-gram + MTP``; it is measured like any
mode and kept only where it beats both none and the best single mode by the tie margin
(run/calibrate/calibration.py).
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


NGRAM_FIRST = "ngram-mod"
"""The n-gram type a combination puts before the model's draft."""
TYPE_SEPARATOR = ","
"""How the engine's ``--spec-type`` lists several types, and how lucebox names a combination."""


def type_parts(spec_type: str) -> tuple[str, ...]:
    """The engine's types in ``spec_type``: one, or a combination's in the engine's order."""
    return tuple(spec_type.split(TYPE_SEPARATOR))


def is_combined(spec_type: str) -> bool:
    return len(type_parts(spec_type)) > 1


def model_type(spec_type: str) -> str:
    """The type that drafts with a model (``draft-mtp`` of ``ngram-mod,draft-mtp``); the type
    itself when none does."""
    models = [t for t in type_parts(spec_type) if not t.startswith("ngram")]
    return models[-1] if models else spec_type


def drafts_from_text_only(spec_type: str) -> bool:
    """Every type in ``spec_type`` is an n-gram lookup: no model drafts, no memory."""
    return all(t.startswith("ngram") for t in type_parts(spec_type))


def mode_of(spec_type: str) -> SpecMode:
    """The ``--spec`` mode that runs ``spec_type``; a combination's is its model draft's (the
    part that needs a file or a head)."""
    return MODE_OF_TYPE.get(model_type(spec_type), "auto")


def combined(candidate: SpecCandidate) -> SpecCandidate:
    """``candidate`` (a model draft) with n-gram lookup in front: the engine asks the n-gram
    table first each step and the model where it has no match."""
    return SpecCandidate(
        f"{NGRAM_FIRST}{TYPE_SEPARATOR}{candidate.spec_type}",
        candidate.uses_draft_file,
        candidate.draft_max,
        candidate.p_min,
        f"n-gram lookup first, where the reply repeats the prompt, then {candidate.why}",
    )


def candidates(files: SpecFiles, spec_types: tuple[str, ...]) -> list[SpecCandidate]:
    """Every speculation the files and the engine allow, best first; the combinations of n-gram
    lookup with each model draft last (only a measurement chooses them)."""
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
    if NGRAM_FIRST in spec_types:
        found += [combined(c) for c in found if not drafts_from_text_only(c.spec_type)]
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
    kept = [
        c
        for c in found
        if model_type(c.spec_type) not in CPU_LOSES or (user_draft and c.uses_draft_file)
    ]
    # A combination goes with its model draft: the note names the draft.
    left = sorted({c.spec_type for c in found if c not in kept and not is_combined(c.spec_type)})
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
    """The candidates a mode allows, best first (auto: all of them; a mode the user chose, its
    own type alone, without n-gram lookup in front)."""
    if mode == "off":
        return []
    if mode == "auto":
        return found
    return [c for c in found if mode_of(c.spec_type) == mode and not is_combined(c.spec_type)]


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
