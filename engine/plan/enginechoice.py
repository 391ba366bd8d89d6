"""Which engine serves a launch: llama-server, or the Lucebox engine (``dflash_server``).

Pure: the planner hands in what it knows (card, files, the context llama-server would
fit) and gets a kind with the reason. llama-server is the default (it loads every model, and
a Qwen3.6 target with its MTP head keeps its measured gain there). The Lucebox engine is
chosen, on an NVIDIA card and for a target family it serves, when a Lucebox DFlash draft is
given or named by the preset, when the context asked for does not fit llama-server in VRAM and
KVFlash would serve it, or when ``--engine lucebox`` asks. A Lucebox draft is never dropped in
silence: it selects that engine, or the reason says why it cannot be used. The address does
not matter: both engines sit behind lucebox's front, which holds the API key (run/front/front.py).

That rule is the prior. Where both engines can serve the launch (a Lucebox draft with a target
both load, or a long context that fits llama-server), the calibration measures both on this card
(plan/engineverdict.py) and its verdict decides under auto, once both builds are installed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from lucebox.engine.engines.kindname import KIND_TEXT, KindName

EngineMode = Literal["auto", "llama-server", "lucebox"]
ENGINE_MODES: tuple[EngineMode, ...] = ("auto", "llama-server", "lucebox")
DRAFT_FAMILIES = {
    "qwen35-dflash-draft": ("qwen35", "qwen35moe"),
    "dflash-draft": ("qwen35", "qwen35moe", "laguna"),
    "gemma4-dflash-draft": ("gemma4",),
}
"""Lucebox DFlash draft architectures and the target families each drafts for."""
KVFLASH_ARCHS = ("qwen35", "qwen35moe", "laguna", "gemma4")
"""Target architectures the engine serves with DFlash drafts and KVFlash (its README's
table); it also loads plain ``qwen3`` (autoregressive only) and ``deepseek4`` (HIP first)."""
LONG_CTX = 32768
"""A context from which both engines are measured for it: KVFlash and the Lucebox engine's
attention may serve long prompts faster (the issue's H200 run: 1.46x decode at 128K)."""
BLOCK_INTERVAL_ARCHS = ("qwen35", "qwen35moe")
"""Its loader wants a block count divisible by the full-attention interval, so the MTP block
of these families is refused (measured: "block_count=9 not divisible by ...=4")."""


@dataclass(frozen=True)
class EngineFacts:
    """What the choice depends on."""

    mode: EngineMode
    mode_from: str
    """Where a mode other than auto comes from ("--engine lucebox", "engine.kind in ...")."""
    target_arch: str
    target_has_mtp: bool
    on_nvidia_gpu: bool
    draft_name: str | None = None
    draft_arch: str | None = None
    """Of the draft given with --draft or named by the preset; None when there is none."""
    llama_fits_ctx: bool = True
    """The context asked for fits llama-server in VRAM (always, when none was asked for)."""
    ctx_asked: int | None = None
    vision_on: bool = False
    """``--vision on`` (or model.vision): images must be served, and the Lucebox engine at its
    pinned commit has no vision."""
    kv_mode: str = "auto"
    """``--kv-mode``: ``kvflash`` pins the Lucebox engine's KVFlash pool, ``exact`` never lets
    a context that does not fit llama-server move to KVFlash (it is not exact)."""
    measured: tuple[KindName, str] | None = None
    """The calibration's verdict for this launch on this card (kind, why); None before both
    engines were measured."""
    missing_build: KindName | None = None
    """The engine of the two that is not installed: it cannot be measured until it is."""


NO_VISION = "the Lucebox engine at its pinned commit has no vision"


@dataclass(frozen=True)
class EngineChoice:
    kind: KindName
    reason: str
    refusal: str | None = None
    """Why the engine asked for cannot serve this launch (the plan must not start)."""
    both: bool = False
    """Both engines can serve this launch: the calibration measures them."""
    measured: bool = False
    """The kind is the calibration's verdict, not the rule's."""
    unmeasured: str = ""
    """What is not measured yet, and what measuring (or building) it would give."""
    key: str | None = None
    """The measurement store's key of the engines' verdict, where both can serve."""
    missing_build: KindName | None = None
    """The engine of the two not installed: neither is measured until it is built."""

    def to_json(self) -> dict[str, str | bool | None]:
        return {
            "kind": self.kind,
            "reason": self.reason,
            "measured": self.measured,
            "unmeasured": self.unmeasured or None,
        }


def is_lucebox_draft(arch: str | None) -> bool:
    return arch in DRAFT_FAMILIES


def blocker(facts: EngineFacts) -> str | None:
    """Why the Lucebox engine cannot serve this launch, or None when it can."""
    if not facts.on_nvidia_gpu:
        return "the Lucebox engine runs only on NVIDIA GPUs (CUDA), and this plan has none"
    if facts.target_arch not in KVFLASH_ARCHS:
        return f"the Lucebox engine does not serve architecture '{facts.target_arch}'"
    if facts.target_has_mtp and facts.target_arch in BLOCK_INTERVAL_ARCHS:
        return (
            "the target carries an MTP block, and the Lucebox engine's loader refuses a block "
            "count not divisible by the full-attention interval: use the plain conversion"
        )
    if facts.draft_arch is not None and is_lucebox_draft(facts.draft_arch):
        families = DRAFT_FAMILIES[facts.draft_arch]
        if facts.target_arch not in families:
            return (
                f"the draft {facts.draft_name} ('{facts.draft_arch}') drafts for "
                f"{', '.join(families)}, not for the target's '{facts.target_arch}'"
            )
    return None


def both_serve(facts: EngineFacts) -> bool:
    """Whether both engines can serve this launch and it is one worth measuring both for: a
    Lucebox draft with a target both load, or a long context that fits llama-server."""
    if blocker(facts) is not None or facts.vision_on or not facts.llama_fits_ctx:
        return False
    if facts.kv_mode == "kvflash":
        return False  # the user's call: lossy modes are never switched on by a measurement
    long_ctx = facts.ctx_asked is not None and facts.ctx_asked >= LONG_CTX
    return is_lucebox_draft(facts.draft_arch) or long_ctx


def choose_engine(facts: EngineFacts) -> EngineChoice:
    """The engine for this launch and why: the rule, or under auto the measured verdict where
    both engines can serve."""
    choice = _rule(facts)
    if not both_serve(facts):
        return choice
    missing = facts.missing_build
    if facts.mode != "auto":
        unmeasured = _unmeasured(facts, forced=True)
        return replace(choice, both=True, unmeasured=unmeasured, missing_build=missing)
    if facts.measured is not None and facts.missing_build is None:
        kind, why = facts.measured
        return EngineChoice(kind, f"{KIND_TEXT[kind]}: {why}", both=True, measured=True)
    reason = f"{choice.reason} (the rule, before a measurement on this card)"
    unmeasured = _unmeasured(facts, forced=False)
    return replace(choice, reason=reason, both=True, unmeasured=unmeasured, missing_build=missing)


def _unmeasured(facts: EngineFacts, *, forced: bool) -> str:
    missing = facts.missing_build
    if missing is not None:
        command = "lucebox engine build" + (" --engine lucebox" if missing == "lucebox" else "")
        gain = (
            "DDTree verification of the Lucebox draft and KVFlash for long contexts"
            if missing == "lucebox"
            else "llama-server's prompt reading (faster for long prompts and short replies)"
        )
        return (
            f"{KIND_TEXT[missing]} is not built, so the engines are not compared on this card: "
            f"`{command}` would let lucebox measure both and serve the faster ({gain})"
        )
    if forced:
        return "the engine is forced: both are measured once idle, and the forced one is kept"
    return "both engines are measured on this card once the server is idle"


def _rule(facts: EngineFacts) -> EngineChoice:
    """The fixed rule (the prior before a measurement)."""
    lucebox_draft = is_lucebox_draft(facts.draft_arch)
    why_not = blocker(facts)
    if facts.mode == "llama-server":
        reason = f"llama-server ({facts.mode_from})"
        if lucebox_draft:
            reason += (
                f"; the draft {facts.draft_name} is made for the Lucebox engine and "
                "llama-server cannot use it"
            )
        return EngineChoice("llama-server", reason)
    if facts.vision_on:
        if facts.mode == "lucebox":
            return EngineChoice(
                "lucebox", f"the Lucebox engine ({facts.mode_from})", f"vision is on: {NO_VISION}"
            )
        given_up = (
            f"; the Lucebox draft {facts.draft_name} and its DDTree gain are given up"
            if lucebox_draft and why_not is None
            else ""
        )
        return EngineChoice("llama-server", f"llama-server: vision is on and {NO_VISION}{given_up}")
    if facts.kv_mode == "kvflash":
        return EngineChoice(
            "lucebox",
            "the Lucebox engine: KVFlash as asked (--kv-mode kvflash; sparse attention over a "
            "resident pool, not exact)",
            why_not,
        )
    if facts.mode == "lucebox":
        if why_not is not None:
            return EngineChoice("lucebox", f"the Lucebox engine ({facts.mode_from})", why_not)
        return EngineChoice("lucebox", f"the Lucebox engine ({facts.mode_from})")
    if lucebox_draft:
        if why_not is None:
            return EngineChoice(
                "lucebox",
                f"the Lucebox engine: the draft {facts.draft_name} is a Lucebox DFlash draft "
                "(DDTree verification)",
            )
        return EngineChoice(
            "llama-server",
            f"llama-server: the Lucebox draft {facts.draft_name} cannot be used: {why_not}",
        )
    if not facts.llama_fits_ctx and why_not is None and facts.kv_mode != "exact":
        return EngineChoice(
            "lucebox",
            f"the Lucebox engine: the {facts.ctx_asked}-token context asked for does not fit "
            "llama-server in VRAM; KVFlash serves it from a resident pool (sparse attention "
            "over the pool, not exact)",
        )
    reason = "llama-server: the default engine"
    if not facts.llama_fits_ctx and facts.kv_mode == "exact":
        reason += (
            f"; the {facts.ctx_asked}-token context asked for does not fit it, and KVFlash "
            "(not exact) is not allowed by --kv-mode exact"
        )
    elif not facts.llama_fits_ctx:
        reason += (
            f"; the {facts.ctx_asked}-token context asked for does not fit it, and KVFlash "
            f"cannot serve it either: {why_not}"
        )
    elif not facts.on_nvidia_gpu:
        reason += " (CPU: the Lucebox engine runs only on NVIDIA GPUs)"
    return EngineChoice("llama-server", reason)
