"""Which quant of a repo to serve (pure): the most precise one the plan fits with enough context.

Each candidate was planned by the one planner for this machine; this module only compares the
verdicts. Precision is bits per weight (weight bytes over the parameter count), not the name.
Enough context is min(native, 32K) tokens, or the context the user asked for. Below 3 bits a
quant is never picked unless named; a named quant is used as asked or refused with the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lucebox.engine.core.errors import GuardRefusal, UsageError
from lucebox.engine.core.units import GIB, gib_text, mib_text
from lucebox.engine.models.quant import LOW_BITS_PER_WEIGHT
from lucebox.engine.plan.memory.ctxchoice import wanted_ctx

SAME_PRECISION_BPW = 0.05
"""Bits per weight closer than this count as a tie: the smaller file wins."""


@dataclass(frozen=True)
class Candidate:
    quant: str
    source: str
    """The pinned file source the store pulls: ``hf:OWNER/REPO/FILE.gguf@COMMIT``."""
    size_bytes: int
    bits_per_weight: float
    fits: bool
    ctx: int
    """The context its plan gives (0 when it does not fit)."""
    largest_ctx: int
    spec: str | None = None
    """The speculation its plan chose (None: none)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "quant": self.quant,
            "size_bytes": self.size_bytes,
            "bits_per_weight": round(self.bits_per_weight, 2),
            "fits": self.fits,
            "ctx": self.ctx if self.fits else 0,
            "spec": self.spec,
        }


@dataclass(frozen=True)
class QuantChoice:
    chosen: Candidate
    why: str
    candidates: tuple[Candidate, ...]


def _size(n_bytes: int) -> str:
    return gib_text(n_bytes, 2) if n_bytes >= GIB else mib_text(n_bytes, 1)


def _line(c: Candidate) -> str:
    verdict = f"fits with {c.ctx:,} tokens" if c.fits else "does not fit"
    return f"{c.quant} ({_size(c.size_bytes)}, {c.bits_per_weight:.2f} bpw): {verdict}"


def _named(candidates: tuple[Candidate, ...], asked: str) -> Candidate:
    wanted = asked.upper()
    for candidate in candidates:
        if candidate.quant.upper() in (wanted, f"UD-{wanted}"):
            return candidate
    raise UsageError(
        f"the repo has no quant {asked}",
        hint=f"its quants: {', '.join(c.quant for c in candidates)}",
    )


def choose(
    candidates: tuple[Candidate, ...],
    native_ctx: int,
    *,
    asked_quant: str | None,
    asked_ctx: int | None,
) -> QuantChoice:
    """The quant to serve, and why; refuses (GuardRefusal) when nothing suitable fits."""
    wanted = wanted_ctx(asked_ctx, native_ctx)
    ranked = tuple(sorted(candidates, key=lambda c: (-c.bits_per_weight, c.size_bytes)))
    if asked_quant is not None:
        named = _named(ranked, asked_quant)
        if not named.fits:
            fitting = [c for c in ranked if c.fits]
            raise GuardRefusal(
                f"{named.quant} does not fit this machine: {_size(named.size_bytes)} of "
                f"weights leave room for {named.largest_ctx:,} tokens of context"
                + (f" ({asked_ctx:,} asked)" if asked_ctx else ""),
                hint=(
                    f"{_line(fitting[0])}: name :{fitting[0].quant}, or leave the quant out"
                    if fitting
                    else "no quant of this repo fits: pick a smaller model"
                ),
            )
        return QuantChoice(named, f"{named.quant} as asked: {_line(named)}", ranked)
    usable = [c for c in ranked if c.bits_per_weight >= LOW_BITS_PER_WEIGHT]
    enough = [c for c in usable if c.fits and c.ctx >= wanted]
    if enough:
        best = enough[0]
        ties = [c for c in enough if best.bits_per_weight - c.bits_per_weight < SAME_PRECISION_BPW]
        best = min(ties, key=lambda c: c.size_bytes)
        more = [c for c in usable if c.bits_per_weight > best.bits_per_weight]
        passed = f"; more precise ones leave less: {', '.join(map(_line, more))}" if more else ""
        why = (
            f"{best.quant}: the most precise quant that fits with at least {wanted:,} tokens "
            f"({_line(best)}){passed}"
        )
        return QuantChoice(best, why, ranked)
    fitting = [c for c in usable if c.fits]
    if fitting:
        best = max(fitting, key=lambda c: (c.ctx, c.bits_per_weight))
        why = (
            f"{best.quant}: no quant of 3 bits or more fits with {wanted:,} tokens; this one "
            f"gives the most context ({_line(best)})"
        )
        return QuantChoice(best, why, ranked)
    low = [c for c in ranked if c.fits]
    smallest = min(ranked, key=lambda c: c.size_bytes)
    raise GuardRefusal(
        "no quant of 3 bits per weight or more fits this machine: " + "; ".join(map(_line, ranked)),
        hint=(
            f"name :{low[0].quant} to accept its lower precision, or pick a smaller model"
            if low
            else f"even {smallest.quant} needs more memory: pick a smaller model"
        ),
    )
