"""What the served requests look like next to the calibration's probes (pure): the rate
without speculation at a request's prompt length, and whether the served mix has moved away
from the one the last measurement was weighed by.

lucebox does not see the text of a request, only what the engine logs for it: the prompt's
length (cached tokens included) and the reply's. Those are the features a probe and a served
request share, so a request is matched to the probe nearest it by both (an edit returns a
reply about as long as the prompt it was given; a rewrite of a whole file, an agent's, reads
a long prompt and returns most of it; an agent turn after a tool call reads a long prompt and
answers briefly; a chat asks little and answers more). Each probe's weight is its share of
the served decoded tokens so matched, as every probe's is; before a judgement it is the
tokens it asks for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

MIX_REQUESTS = 64
"""Served requests the mix is judged over: the most recent ones, so an old workload fades."""
MIN_MIX_REQUESTS = 16
"""Served requests a judgement of the mix needs: fewer say little about a workload."""
MIX_SHIFT = 0.3
"""Share of the decoded tokens that must have moved to other kinds of request before a
re-measure: per-probe ratios of one mode differ by 0.5x and more (n-gram on an edit vs a
chat), so such a move changes the mixed ratio by about 0.15, five times the calibration's 3%
tie margin; smaller moves are day-to-day drift and would re-measure for nothing."""


@dataclass(frozen=True)
class ServedRequest:
    """One finished request as the engine logged it."""

    prompt_tokens: int
    """The whole prompt the reply decoded after, cached tokens included."""
    reply_tokens: int
    decode_s: float
    speculated: bool = True
    """False: the engine decoded this reply without its draft (the Lucebox engine's sampled
    replies where its family has no sampled verification); the guard judges the draft by the
    others."""

    @property
    def decode_steps(self) -> int:
        """Reply tokens less the first, which comes with the prompt (the engine's rule)."""
        return max(0, self.reply_tokens - 1)


@dataclass(frozen=True)
class ProbeShape:
    """One probe as measured without speculation: its lengths, rate and weight in the mix."""

    name: str
    prompt_tokens: int
    reply_tokens: int
    tok_s: float
    weight: float


@dataclass(frozen=True)
class RateCurve:
    """Decode rate without speculation by prompt length, from the probes that recorded one;
    ``overall_tok_s`` where none did (measurements stored before prompt lengths were kept)."""

    points: tuple[tuple[int, float], ...]
    """(prompt tokens, tok/s), sorted by prompt tokens, one per length."""
    overall_tok_s: float

    @classmethod
    def of(cls, probes: Sequence[ProbeShape], overall_tok_s: float) -> RateCurve:
        by_length: dict[int, list[float]] = {}
        for probe in probes:
            if probe.prompt_tokens > 0 and probe.tok_s > 0:
                by_length.setdefault(probe.prompt_tokens, []).append(probe.tok_s)
        points = tuple((n, sum(r) / len(r)) for n, r in sorted(by_length.items()))
        return cls(points, overall_tok_s)

    def tok_s_at(self, prompt_tokens: int) -> float:
        """The rate interpolated at ``prompt_tokens``, clamped to the measured lengths: beyond
        them nothing was measured, and a guess outside would judge by a number no probe saw."""
        points = self.points
        if not points:
            return self.overall_tok_s
        if prompt_tokens <= points[0][0]:
            return points[0][1]
        for (n0, r0), (n1, r1) in pairwise(points):
            if prompt_tokens <= n1:
                return r0 + (r1 - r0) * (prompt_tokens - n0) / (n1 - n0)
        return points[-1][1]

    def none_s(self, requests: Sequence[ServedRequest]) -> float:
        """Seconds ``requests``' decode steps would have taken without speculation, each at the
        rate measured for prompts of its length."""
        return sum(
            r.decode_steps / rate
            for r in requests
            if r.decode_steps > 0 and (rate := self.tok_s_at(r.prompt_tokens)) > 0
        )


def _distance(prompt_tokens: int, reply_tokens: int, probe: ProbeShape) -> float:
    """How far apart two requests are in log prompt and log reply length."""
    return abs(math.log2((prompt_tokens + 1) / (probe.prompt_tokens + 1))) + abs(
        math.log2((reply_tokens + 1) / (probe.reply_tokens + 1))
    )


def nearest_probe(request: ServedRequest, probes: Sequence[ProbeShape]) -> str:
    return min(probes, key=lambda p: _distance(request.prompt_tokens, request.reply_tokens, p)).name


def served_mix(
    requests: Sequence[ServedRequest], probes: Sequence[ProbeShape], *, by_requests: bool = False
) -> dict[str, float]:
    """Each probe's share of the decoded tokens of ``requests`` matched to it (of the requests
    themselves with ``by_requests``: an engine's time goes to reading prompts too)."""
    counts = dict.fromkeys((p.name for p in probes), 0)
    for request in requests:
        counts[nearest_probe(request, probes)] += 1 if by_requests else request.reply_tokens
    total = sum(counts.values())
    return {name: count / total for name, count in counts.items()} if total else {}


def probe_mix(probes: Sequence[ProbeShape]) -> dict[str, float]:
    """The probes' own mix: each weighted as the calibration weighs it."""
    total = sum(p.weight for p in probes)
    return {p.name: p.weight / total for p in probes} if total else {}


def mix_text(mix: Mapping[str, float]) -> str:
    """``edit 70%, agent 20%, chat 10%``: the larger shares first, empty ones left out."""
    ordered = sorted(mix.items(), key=lambda item: -item[1])
    return ", ".join(f"{name} {share:.0%}" for name, share in ordered if share >= 0.005)


def mix_moved(
    requests: Sequence[ServedRequest],
    probes: Sequence[ProbeShape],
    measured: Mapping[str, float],
    *,
    by_requests: bool = False,
) -> tuple[dict[str, float], str] | None:
    """The served mix and why it calls for a re-measure, when it has moved at least
    ``MIX_SHIFT`` (half the summed differences of the shares) from ``measured``; None while
    it has not, or too few requests (or probes with lengths) say so."""
    recent = requests[-MIX_REQUESTS:]
    if len(recent) < MIN_MIX_REQUESTS or not measured:
        return None
    if not any(p.prompt_tokens > 0 for p in probes):
        return None  # a measurement stored before prompt lengths were kept
    served = served_mix(recent, probes, by_requests=by_requests)
    if not served:
        return None
    names = set(served) | set(measured)
    shift = sum(abs(served.get(n, 0.0) - measured.get(n, 0.0)) for n in names) / 2
    if shift < MIX_SHIFT:
        return None
    why = (
        f"the served mix moved {shift:.0%} from the measured one over the last {len(recent)} "
        f"requests (served {mix_text(served)}; measured {mix_text(measured)})"
    )
    return served, why
