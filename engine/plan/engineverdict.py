"""Which engine serves a launch that both can serve, from what each measured on this card (pure).

Decode speed alone picks the wrong engine for agent work: on the H100 the Lucebox engine
(DDTree) decoded 1.46x faster than llama-server (n-gram) but read prompts 2.5x to 30x slower, so
a short reply after a long prompt came later. So each engine runs the same probes (with its own
best speculation), and a request of the served mix costs, on each engine, the seconds to read its
prompt plus the seconds to decode its reply, each at the rate measured for prompts of its
length. The engine with the fewer seconds over the mix serves; the Lucebox engine must win by
more than ``ENGINE_TIE_MARGIN``, ties go to llama-server (it serves every model and has the
larger ecosystem). Before both were measured the fixed rule (plan/enginechoice.py) is the prior.

Two runs of one launch can differ by more than the margin (warm-up, clocks), so a verdict knows
its spread: where the two engines come closer than ``UNSURE_GAP`` after one run each, both run
the probes again, and again (up to ``MAX_RUNS``) while they stay within their run-to-run spread;
the Lucebox engine then serves only when it wins by more than the margin and the spread. Each
figure is shown with its spread.

The verdict is kept in the measurement store's ``engines`` section per launch (the files, the
card, the context) and per sampling (greedy and sampled replies run differently,
plan/samplingdefaults.py), with the mix it was weighed by: a re-measure comes only when the
served mix moves ``MIX_SHIFT`` away from that one (plan/speculation/workload.py), which keeps
the choice from flapping.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from lucebox.engine.core.paths import Paths
from lucebox.engine.engines.kindname import KIND_TEXT, KindName
from lucebox.engine.plan.speculation import measurements
from lucebox.engine.plan.speculation.measurements import ProbeRate, TrialRate
from lucebox.engine.plan.speculation.spread import RepeatRule, spread
from lucebox.engine.plan.speculation.workload import (
    ProbeShape,
    RateCurve,
    ServedRequest,
    mix_text,
    served_mix,
)

ENGINE_TIE_MARGIN = 0.05
"""The Lucebox engine serves only when the mix takes this share less time on it: two runs of
one launch differ by 1-2% (the calibration's 3% margin), and a switch costs a restart and
gives up llama-server's wider support, so a near tie stays with llama-server."""
UNSURE_GAP = 0.15
"""After one run each, engines closer than this are measured again: two default launches of
one model on one card have differed by more than the margin."""
MAX_RUNS = 3
"""Runs of the probe set per engine at most: each is a restart and minutes of probes."""
RULE = RepeatRule(ENGINE_TIE_MARGIN, UNSURE_GAP, MAX_RUNS)
ENGINE_KINDS: tuple[KindName, ...] = ("llama-server", "lucebox")
SECTION = "engines"


@dataclass(frozen=True)
class EngineCost:
    """What the served mix costs on one engine, per request on average."""

    kind: KindName
    request_s: float
    decode_tok_s: float
    ttft_s: float
    spread: float = 0.0
    """The runs' request seconds, highest less lowest over their mean (0 with one run)."""
    runs: int = 1

    def text(self) -> str:
        runs = f", ±{self.spread / 2:.0%} over {self.runs} runs" if self.runs > 1 else ""
        return (
            f"{KIND_TEXT[self.kind]} {self.request_s:.2f} s a request "
            f"(decode {self.decode_tok_s:.0f} tok/s, first token {self.ttft_s:.2f} s{runs})"
        )


def _curves(trial: TrialRate, probes: Sequence[ProbeRate]) -> tuple[RateCurve, RateCurve]:
    """Decode and prompt-reading rates of one run (``probes``) of ``trial`` by prompt length."""
    run = replace(trial, probes=tuple(probes), repeats=())
    decode = run.shapes()
    read = tuple(
        ProbeShape(p.name, p.prompt_tokens, p.tokens, p.prompt_tokens / p.prefill_s, p.asked)
        for p in probes
        if p.prefill_s > 0 and p.prompt_tokens > 0
    )
    read_tokens = sum(p.prompt_tokens for p in read)
    read_s = sum(p.prompt_tokens / p.tok_s for p in read if p.tok_s > 0)
    overall = read_tokens / read_s if read_s > 0 else 0.0
    return RateCurve.of(decode, run.tok_s), RateCurve.of(read, overall)


def probe_requests(trial: TrialRate) -> tuple[ServedRequest, ...]:
    """The probes as requests: the mix weighed before anything was served."""
    return tuple(ServedRequest(p.prompt_tokens, p.asked, 0.0) for p in trial.probes)


def cost(kind: KindName, trial: TrialRate, requests: Sequence[ServedRequest]) -> EngineCost:
    """Seconds ``requests`` take on ``kind`` as measured by ``trial``, per request: the mean
    over its runs, with their spread."""
    each = [_run_cost(kind, trial, run, requests) for run in trial.runs()]
    count = len(each)
    return EngineCost(
        kind,
        sum(c.request_s for c in each) / count,
        sum(c.decode_tok_s for c in each) / count,
        sum(c.ttft_s for c in each) / count,
        spread([c.request_s for c in each]),
        count,
    )


def _run_cost(
    kind: KindName,
    trial: TrialRate,
    probes: Sequence[ProbeRate],
    requests: Sequence[ServedRequest],
) -> EngineCost:
    decode, read = _curves(trial, probes)
    ttft = decode_s = tokens = 0.0
    for request in requests:
        read_tok_s = read.tok_s_at(request.prompt_tokens)
        decode_tok_s = decode.tok_s_at(request.prompt_tokens)
        ttft += request.prompt_tokens / read_tok_s if read_tok_s > 0 else 0.0
        decode_s += request.reply_tokens / decode_tok_s if decode_tok_s > 0 else float("inf")
        tokens += request.reply_tokens
    count = max(1, len(requests))
    return EngineCost(
        kind,
        (ttft + decode_s) / count,
        tokens / decode_s if decode_s > 0 else 0.0,
        ttft / count,
    )


@dataclass(frozen=True)
class EngineMeasurement:
    """Each engine's rates for one launch, and the verdict once both are measured."""

    key: str
    trials: tuple[tuple[KindName, TrialRate], ...] = ()
    chosen: KindName | None = None
    why: str = ""
    mix: tuple[tuple[str, float], ...] = ()
    """The served mix (shares of the probes) the verdict was weighed by; empty: the probes'."""
    remeasure_at: float = 0.0
    """Unix time the served mix moved away from ``mix``: rates measured before it are due."""

    def trial(self, kind: KindName) -> TrialRate | None:
        return next((t for k, t in self.trials if k == kind), None)

    def fresh(self, kind: KindName) -> bool:
        trial = self.trial(kind)
        return trial is not None and trial.at >= self.remeasure_at

    def unmeasured(self, kinds: Sequence[KindName] = ENGINE_KINDS) -> tuple[KindName, ...]:
        return tuple(k for k in kinds if not self.fresh(k))

    def with_trial(self, kind: KindName, trial: TrialRate) -> EngineMeasurement:
        kept = tuple((k, t) for k, t in self.trials if k != kind)
        return replace(self, trials=(*kept, (kind, trial)))

    def to_json(self) -> dict[str, Any]:
        return {
            "trials": {k: t.to_json() for k, t in self.trials},
            "chosen": self.chosen,
            "why": self.why,
            "mix": dict(self.mix),
            "remeasure_at": self.remeasure_at,
        }

    @classmethod
    def from_json(cls, key: str, data: Any) -> EngineMeasurement | None:
        if not isinstance(data, dict):
            return None
        stored = data.get("trials")
        trials = []
        for kind in ENGINE_KINDS:
            found = TrialRate.from_json(stored.get(kind)) if isinstance(stored, dict) else None
            if found is not None:
                trials.append((kind, found))
        chosen = data.get("chosen")
        mix = data.get("mix")
        shares = mix.items() if isinstance(mix, dict) else ()
        return cls(
            key,
            tuple(trials),
            chosen if chosen in ENGINE_KINDS else None,
            str(data.get("why") or ""),
            tuple(sorted((str(n), float(v)) for n, v in shares if isinstance(v, int | float))),
            float(data.get("remeasure_at") or 0.0),
        )


def served_requests(
    measurement: EngineMeasurement, requests: Sequence[ServedRequest]
) -> Sequence[ServedRequest]:
    """What the verdict weighs: the served requests when there are any, else the probes."""
    if requests:
        return requests
    base = measurement.trial("llama-server") or measurement.trial("lucebox")
    return probe_requests(base) if base is not None else ()


def verdict(
    measurement: EngineMeasurement, requests: Sequence[ServedRequest]
) -> tuple[KindName, str, tuple[EngineCost, ...]]:
    """The engine to serve (both measured), why, and what the mix costs on each."""
    llama, luce = measurement.trial("llama-server"), measurement.trial("lucebox")
    if llama is None or luce is None:
        return "llama-server", "not both engines measured", ()
    weighed = served_requests(measurement, requests)
    costs = (cost("llama-server", llama, weighed), cost("lucebox", luce, weighed))
    over = "the served mix" if requests else "the probes' own mix"
    if requests:
        over += f" ({mix_text(served_mix(requests, llama.shapes(), by_requests=True))})"
    text = f"measured on this card over {over}: {costs[0].text()}; {costs[1].text()}"
    spreads = [c.spread for c in costs]
    faster = costs[1].request_s < costs[0].request_s * (1 - RULE.margin(spreads))
    if faster:
        return "lucebox", f"the Lucebox engine is faster, {text}", costs
    tie = costs[1].request_s < costs[0].request_s
    lead = f"llama-server: within {RULE.within(spreads)}" if tie else "llama-server is faster"
    return "llama-server", f"{lead}, {text}", costs


def needs_another_run(costs: Sequence[EngineCost]) -> bool:
    """Whether both engines run the probes again before the verdict stands: they are closer
    than ``UNSURE_GAP`` after one run each, or than their spread after more, and neither has
    run ``MAX_RUNS`` times."""
    if len(costs) < 2:
        return False
    fast, slow = sorted(c.request_s for c in costs[:2])
    if slow <= 0:
        return False
    return RULE.needs_another_run(
        1 - fast / slow, [c.runs for c in costs[:2]], [c.spread for c in costs[:2]]
    )


def launch_key(key: measurements.MeasurementKey) -> str:
    """The store's key for a launch both engines serve: the files, the card, the context and
    the sampling of the speculation key, less the build and the KV type (each engine plans its
    own)."""
    return at_sampling(
        " | ".join([key.model, key.draft or "-", key.card, str(key.ctx)]), key.sampling
    )


_LAUNCH_PARTS = 4
"""The parts of a launch key before its sampling."""


def at_sampling(key: str, sampling: str) -> str:
    """``key`` for replies at ``sampling``: greedy keys read as before sampling was kept."""
    return measurements.at_sampling(key, sampling, _LAUNCH_PARTS)


def read_engines(paths: Paths, key: str) -> EngineMeasurement | None:
    return EngineMeasurement.from_json(key, measurements.read_section(paths, SECTION).get(key))


def write_engines(paths: Paths, measurement: EngineMeasurement) -> None:
    measurements.write_entry(paths, SECTION, measurement.key, measurement.to_json())
