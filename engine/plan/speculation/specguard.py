"""Never let speculation make decoding slower (pure): watch the acceptance, decide when to
shorten the drafts or stop speculating.

A wrong draft costs far more than it saves (measured with the pinned engine on a CPU: decode
fell to 0.14x with 3-token MTP drafts, 0.07x with 15-token DFlash drafts and 0.70x with n-gram
drafts when few were accepted; on an H100 to 0.40x, 0.34x and 0.88x). Each mode has a
break-even acceptance below which the plain engine is faster; the guard decides only after
enough drafted tokens, acts only clearly below the floor, and acts in one direction (shorter,
then off), so it never flaps. The server applies a decision by restarting the engine when no
request is running.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from lucebox.engine.plan.speculation.speculation import drafts_from_text_only, model_type
from lucebox.engine.plan.speculation.workload import RateCurve, ServedRequest

MIN_DRAFTED_TOKENS = 256
"""Drafted tokens a decision needs: fewer say little about a model's acceptance."""
HYSTERESIS = 0.05
"""Act only this far below the floor (a quarter of a floor under 0.2): acceptance near
break-even costs nothing either way."""
CPU_BREAK_EVEN: dict[tuple[str, int | None], float] = {
    ("draft-mtp", 3): 1.0,
    ("draft-mtp", 6): 1.0,
    ("draft-simple", 6): 1.0,
    ("draft-dflash", 15): 0.65,
    ("draft-dspark", 15): 0.65,
    ("ngram-mod", None): 0.6,
}
"""Break-even acceptance on a CPU, from decode speed per engine CPU-second with every draft
accepted and with none (benchmarks/spec_breakeven.py --head-dim 128: the real models' head width,
Q8_0 and Q4_0, benchmarks/results/cpu-spec-breakeven-head128-*.json):
(1 + a k) / (t_none + a (t_all - t_none)) = 1. MTP never paid off (1.0 = off as soon as
anything is rejected); a draft model paid off only at Q8_0 (0.79; at Q4_0 even every draft
accepted was 0.93x), so it stays 1.0; DFlash needed 0.63-0.65; n-gram 0.44-0.59 (the higher
kept: the prior only acts before a measurement exists)."""
CPU_DEFAULT_FLOOR = 0.9
"""A mode or draft length not measured on a CPU: model drafts rarely pay off there."""
LUCEBOX_FLOOR = 1 / 16
"""The Lucebox engine's acceptance is accepted tokens per verified position (16 a step), not
per drafted token: a real pair committing 5-8 tokens a step reads 0.25-0.45. At this floor a
step commits about 2 tokens; below it the draft only costs (0 accepted decoded at 0.37x of
plain decoding on the H100, tests/engine/fixtures/lucebox/ddtree-spec.log). Between the two,
throughput measured without the draft decides (``judge_rate``), not a prior."""
LUCEBOX_SPEC_TYPES = ("ddtree", "dflash")
CUDA_BREAK_EVEN: dict[tuple[str, int | None], float] = {
    ("draft-mtp", 3): 0.6,
    ("draft-mtp", 6): 0.43,
    ("draft-simple", 6): 0.67,
    ("draft-dflash", 15): 0.16,
    ("draft-dspark", 15): 0.16,
    ("ngram-mod", None): 0.46,
}
"""Break-even acceptance on CUDA, from wall-clock decode speed on an H100 with a 1.7 GB F16
hybrid target (benchmarks/spec_breakeven.py --scale 32 --layers 16 --quant F16 --threads 4; the
run is in benchmarks/results/h100-spec-breakeven-f16-1.7gb.json). A
home card's 15 GB model verifies a draft relatively more cheaply, so its true break-even is
lower: these floors err towards switching off."""
CUDA_DEFAULT_FLOOR = 0.7
"""A mode or draft length not measured on CUDA: above every measured break-even."""
MIN_DECODED_TOKENS = 512
"""Decoded tokens a throughput judgement needs (about a second on a GPU, a minute on a CPU)."""
RATE_MARGIN = 0.15
"""Act only when decoding runs this far below the rate measured without speculation for
prompts of the same lengths: past the longest probe the rate is the longest probe's, and
longer contexts slow any mode a little."""


def acceptance_floor(spec_type: str, draft_max: int | None, on_gpu: bool) -> tuple[float, str]:
    """The acceptance below which ``spec_type`` slows decoding, and where the number is from
    (a phrase that follows "below")."""
    backend, table, default = (
        ("on CUDA", CUDA_BREAK_EVEN, CUDA_DEFAULT_FLOOR)
        if on_gpu
        else ("on a CPU", CPU_BREAK_EVEN, CPU_DEFAULT_FLOOR)
    )
    if spec_type in LUCEBOX_SPEC_TYPES:
        return LUCEBOX_FLOOR, (
            f"{LUCEBOX_FLOOR:.0%} of verified positions accepted (about 2 tokens a step, "
            "where the draft stops paying for itself)"
        )
    if drafts_from_text_only(spec_type):
        # Every n-gram type drafts from the text itself and costs the same to check.
        ngram = table[("ngram-mod", None)]
        return ngram, f"the {ngram:.0%} break-even measured for ngram-mod {backend}"
    # N-gram lookup in front of a model draft: the model's drafts are what cost a check.
    spec_type = model_type(spec_type)
    floor = table.get((spec_type, draft_max))
    if floor is None:
        return default, (
            f"a {default:.0%} floor ({spec_type} with {draft_max}-token drafts "
            f"was not measured {backend})"
        )
    return floor, f"the {floor:.0%} break-even measured for {spec_type} {backend}"


def can_shorten(draft_max: int | None, shortened: bool) -> bool:
    """The guard's first step: halve the drafts once, when they are longer than two tokens."""
    return not shortened and draft_max is not None and draft_max > 2


def describe(
    spec_type: str,
    draft_max: int | None,
    on_gpu: bool,
    *,
    user_chose: bool,
    shortened: bool,
    measured: bool = False,
) -> str:
    """What the guard will do with this launch, for the plan's reasons; ``measured``: the
    calibration has a rate without speculation for it, which the guard then judges by."""
    _, floor_source = acceptance_floor(spec_type, draft_max, on_gpu)
    if user_chose:
        action = "warns"
    elif can_shorten(draft_max, shortened):
        action = "shortens the drafts, then stops speculating,"
    else:
        action = "stops speculating"
    if measured:
        return (
            f"the guard {action} if decoding falls {RATE_MARGIN:.0%} below the rate measured "
            "without speculation for prompts of the same length"
        )
    return f"the guard {action} below {floor_source}"


@dataclass(frozen=True)
class Decision:
    action: Literal["shorten", "off"]
    acceptance: float
    draft_max: int | None
    """The new draft length when shortening."""
    reason: str
    observed: str
    """What was seen, without the action (for a warning when the user chose the mode)."""


@dataclass(frozen=True)
class RateSums:
    """Decoding summed over the requests since a judgement, with the seconds the same steps
    take without speculation at each request's prompt length."""

    decoded: int = 0
    decode_s: float = 0.0
    none_s: float = 0.0
    drafted_at_start: int = 0
    """The engine's drafted-token count when the sums began."""

    def plus(self, requests: Sequence[ServedRequest], baseline: RateCurve | None) -> RateSums:
        return replace(
            self,
            decoded=self.decoded + sum(r.decode_steps for r in requests),
            decode_s=self.decode_s + sum(r.decode_s for r in requests),
            none_s=self.none_s + (baseline.none_s(requests) if baseline else 0.0),
        )


@dataclass(frozen=True)
class SpecGuard:
    """What the guard watches; a new value after each judgement."""

    spec_type: str
    draft_max: int | None
    on_gpu: bool
    floor: float
    floor_source: str
    drafted_at_start: int = 0
    accepted_at_start: int = 0
    shortened: bool = False
    baseline: RateCurve | None = None
    """Decode rate measured on this card without speculation, by prompt length: with it,
    throughput decides and the acceptance floors (a prior) no longer do."""
    window: RateSums = field(default_factory=RateSums)
    """What was decoded since the last throughput judgement."""

    @classmethod
    def for_launch(
        cls,
        spec_type: str,
        draft_max: int | None,
        on_gpu: bool,
        *,
        shortened: bool = False,
        baseline: RateCurve | None = None,
    ) -> SpecGuard:
        floor, source = acceptance_floor(spec_type, draft_max, on_gpu)
        return cls(
            spec_type, draft_max, on_gpu, floor, source, shortened=shortened, baseline=baseline
        )

    def judge_rate(
        self, requests: Sequence[ServedRequest], drafted_total: int
    ) -> tuple[SpecGuard, Decision | None]:
        """Judge decoding since the last judgement (the requests finished since the last call,
        the engine's running count of drafted tokens): a model draft that drafts nothing, or
        decoding below the rate measured without speculation for prompts of the same lengths,
        goes. N-gram drafts cost nothing when they find no match: exempt from both (not with a
        model drafting behind them)."""
        # A reply the engine decoded without its draft says nothing about the draft.
        requests = [r for r in requests if r.speculated]
        sums = self.window
        if drafted_total < sums.drafted_at_start:  # a new engine process: its count restarts
            sums = RateSums(drafted_at_start=drafted_total)
        sums = sums.plus(requests, self.baseline)
        if sums.decoded < MIN_DECODED_TOKENS or sums.decode_s <= 0:
            return replace(self, window=sums), None
        window = replace(self, window=RateSums(drafted_at_start=drafted_total))
        drafted = drafted_total - sums.drafted_at_start
        rate = sums.decoded / sums.decode_s
        none_tok_s = sums.decoded / sums.none_s if sums.none_s > 0 else None
        ratio = rate / none_tok_s if none_tok_s else None
        ratio_text = f", {ratio:.2f}x of none" if ratio is not None else ""
        text_only = drafts_from_text_only(self.spec_type)
        if drafted == 0 and not text_only:
            seen = f"drafted nothing in {sums.decoded} decoded tokens{ratio_text}"
            return window, Decision("off", 0.0, None, f"{seen}; speculation switched off", seen)
        if ratio is None or ratio >= 1 - RATE_MARGIN or text_only:
            return window, None
        seen = (
            f"decoding at {rate:.0f} tok/s, {ratio:.2f}x of the {none_tok_s:.0f} tok/s "
            "measured without speculation for prompts of these lengths"
        )
        return self._step_down(window, 0.0, seen)

    def judge(self, drafted_total: int, accepted_total: int) -> tuple[SpecGuard, Decision | None]:
        """Judge the drafts since the last decision point (the engine's running totals)."""
        if self.baseline is not None:
            return self, None  # measured: throughput decides (judge_rate)
        drafted = drafted_total - self.drafted_at_start
        if drafted < 0:  # a new engine process: its counters start again
            return replace(self, drafted_at_start=0, accepted_at_start=0), None
        if drafted < MIN_DRAFTED_TOKENS:
            return self, None
        acceptance = (accepted_total - self.accepted_at_start) / drafted
        window = replace(self, drafted_at_start=drafted_total, accepted_at_start=accepted_total)
        if acceptance >= self.floor - min(HYSTERESIS, self.floor / 4):
            return window, None
        seen = f"{acceptance:.0%} of {drafted} drafted tokens accepted, below {self.floor_source}"
        return self._step_down(window, acceptance, seen)

    def _step_down(
        self, window: SpecGuard, acceptance: float, seen: str
    ) -> tuple[SpecGuard, Decision]:
        """Shorter drafts first (once), then off."""
        if self.draft_max is not None and can_shorten(self.draft_max, self.shortened):
            shorter = max(2, self.draft_max // 2)
            decision = Decision(
                "shorten",
                acceptance,
                shorter,
                f"{seen}; drafts shortened to {shorter} tokens",
                seen,
            )
            # Shorter drafts have their own break-even (higher: fewer tokens per check).
            floor, source = acceptance_floor(self.spec_type, shorter, self.on_gpu)
            shortened = replace(
                window, draft_max=shorter, shortened=True, floor=floor, floor_source=source
            )
            return shortened, decision
        return window, Decision("off", acceptance, None, f"{seen}; speculation switched off", seen)
