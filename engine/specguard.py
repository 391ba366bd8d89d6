"""Never let speculation make decoding slower (pure): watch the acceptance, decide when to
shorten the drafts or stop speculating.

A wrong draft costs far more than it saves (measured with the pinned engine on a 2-core CPU:
decode fell to 0.36x with 3-token MTP drafts, 0.31x with 6, 0.21x with 15-token DFlash drafts
and 0.95x with n-gram drafts when none was accepted). Each mode has a break-even acceptance
below which the plain engine is faster; the guard decides only after enough drafted tokens,
acts only clearly below the floor, and acts in one direction (shorter, then off), so it never
flaps. The server applies a decision by restarting the engine when no request is running.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

MIN_DRAFTED_TOKENS = 256
"""Drafted tokens a decision needs: fewer say little about a model's acceptance."""
HYSTERESIS = 0.05
"""Act only this far below the floor: acceptance near break-even costs nothing either way."""
CPU_BREAK_EVEN: dict[tuple[str, int | None], float] = {
    ("draft-mtp", 3): 0.70,
    ("draft-mtp", 6): 0.41,
    ("draft-dflash", 15): 0.26,
    ("draft-dspark", 15): 0.26,
    ("ngram-mod", None): 0.05,
}
"""Break-even acceptance on a CPU, from decode speed with every draft accepted and with none
(bench/spec_breakeven.py): (1 + a k) / (t_none + a (t_all - t_none)) = 1 per plain token."""
CPU_DEFAULT_FLOOR = 0.5
"""A mode or draft length not measured on a CPU: half the drafts must land."""
CUDA_FLOOR = 0.3
"""Not yet measured on CUDA, where verifying k+1 tokens costs about one token's time and the
break-even is lower than on a CPU: a conservative floor until bench/spec_breakeven.py runs
on a GPU. n-gram drafts cost almost nothing anywhere."""
NGRAM_FLOOR = 0.05


def acceptance_floor(spec_type: str, draft_max: int | None, on_gpu: bool) -> tuple[float, str]:
    """The acceptance below which ``spec_type`` slows decoding, and where the number is from."""
    if spec_type.startswith("ngram"):
        return NGRAM_FLOOR, "n-gram drafts cost almost nothing: off below 5% accepted"
    if on_gpu:
        return CUDA_FLOOR, "a conservative 30% floor (break-even not yet measured on CUDA)"
    floor = CPU_BREAK_EVEN.get((spec_type, draft_max))
    if floor is None:
        return CPU_DEFAULT_FLOOR, "a 50% floor (this draft length was not measured on a CPU)"
    return floor, f"{floor:.0%} accepted: the measured CPU break-even of {spec_type}"


@dataclass(frozen=True)
class Decision:
    action: Literal["shorten", "off"]
    acceptance: float
    draft_max: int | None
    """The new draft length when shortening."""
    reason: str


@dataclass(frozen=True)
class SpecGuard:
    """What the guard watches; a new value after each judgement."""

    spec_type: str
    draft_max: int | None
    floor: float
    floor_source: str
    drafted_at_start: int = 0
    accepted_at_start: int = 0
    shortened: bool = False

    @classmethod
    def for_launch(cls, spec_type: str, draft_max: int | None, on_gpu: bool) -> SpecGuard:
        floor, source = acceptance_floor(spec_type, draft_max, on_gpu)
        return cls(spec_type, draft_max, floor, source)

    def judge(self, drafted_total: int, accepted_total: int) -> tuple[SpecGuard, Decision | None]:
        """Judge the drafts since the last decision point (the engine's running totals)."""
        drafted = drafted_total - self.drafted_at_start
        if drafted < 0:  # a new engine process: its counters start again
            return replace(self, drafted_at_start=0, accepted_at_start=0), None
        if drafted < MIN_DRAFTED_TOKENS:
            return self, None
        acceptance = (accepted_total - self.accepted_at_start) / drafted
        window = replace(self, drafted_at_start=drafted_total, accepted_at_start=accepted_total)
        if acceptance >= self.floor - HYSTERESIS:
            return window, None
        seen = f"{acceptance:.0%} of {drafted} drafted tokens accepted, below {self.floor_source}"
        if not self.shortened and self.draft_max is not None and self.draft_max > 2:
            shorter = max(2, self.draft_max // 2)
            decision = Decision(
                "shorten", acceptance, shorter, f"{seen}: drafts shortened to {shorter} tokens"
            )
            return replace(window, draft_max=shorter, shortened=True), decision
        return window, Decision("off", acceptance, None, f"{seen}: speculation switched off")
