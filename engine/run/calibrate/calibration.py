"""Which speculation to serve, from decode rates measured on this card (pure).

Floors from a break-even table cannot know a given file, quant, card and prompt mix (a head
that never passes its p-min drafts nothing yet costs a third of the speed), so the calibration
measures: the probe set with no speculation and with at most three configurations the planner
allows, each a restart through the planner. The fastest by token-weighted decode (each probe
weighted by the tokens it asks for, the same mix for every configuration) wins; a mode
must beat none by more than the noise of one measurement, so ties go to none. N-gram lookup
combined with the model's draft (plan/speculation/speculation.py) is measured besides, in a
place of its own, and must also beat the best single mode by that margin: ties go to the
simpler. A mode the user forced is measured too (against none), so they see what it costs, but
is kept.

Two runs of one launch differ, on a busy machine by more than the margin, so the verdict knows
its spread: where the two fastest (none among them) come closer than ``UNSURE_GAP`` after one
run each, both run the probes again, and again (up to ``MAX_RUNS``) while they stay within their
run-to-run spread (:func:`too_close`); a mode then serves (or a combination over a single mode)
only when it wins by more than the margin and the spread. Each figure is shown with its spread.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from lucebox.engine.plan import samplingdefaults
from lucebox.engine.plan.speculation.measurements import (
    OFF,
    Measurement,
    ProbeRate,
    TrialRate,
    config_label,
)
from lucebox.engine.plan.speculation.speculation import (
    SpecCandidate,
    SpecMode,
    is_combined,
    mode_of,
)
from lucebox.engine.plan.speculation.spread import RepeatRule
from lucebox.engine.run.sample import MeasuredRate, SamplingRate, SamplingStatus, SpecStatus

MAX_CANDIDATES = 3
"""Single modes measured besides none: each costs a restart and the probes."""
MAX_COMBINATIONS = 1
"""Combinations of n-gram lookup with a model draft measured besides: the first planned."""
TIE_MARGIN = 0.03
"""A mode must beat none by more than this share to be chosen: two runs of the same launch
differ by about 1-2% (benchmarks/spec_breakeven.py), and a tie costs nothing to lose."""
UNSURE_GAP = 0.06
"""After one run each, the two fastest closer than this run again: twice the tie margin, where
a launch's 1-2% run-to-run difference can still flip the verdict. The engine verdict's 15%
would re-run nearly every n-gram trial (often within 10% of none), and each run is a restart
and the probe set."""
MAX_RUNS = 3
"""Runs of the probe set per configuration at most: the second gives the two their spread,
the third checks it; a near tie beyond that costs little either way, and the speculation
guard (plan/speculation/specguard.py) watches the served rate besides."""
RULE = RepeatRule(TIE_MARGIN, UNSURE_GAP, MAX_RUNS)


@dataclass(frozen=True)
class Trial:
    """One configuration to measure: what the planner is asked to re-plan with."""

    label: str
    mode: SpecMode
    spec_type: str | None
    draft_max: int | None
    p_min: float | None


OFF_TRIAL = Trial(OFF, "off", None, None, None)


def trial_of(spec_type: str | None, draft_max: int | None, p_min: float | None) -> Trial:
    if spec_type is None:
        return OFF_TRIAL
    mode = mode_of(spec_type)
    return Trial(config_label(spec_type, draft_max, p_min), mode, spec_type, draft_max, p_min)


def trials_for(candidates: Sequence[SpecCandidate], *, forced: bool) -> tuple[Trial, ...]:
    """None first, then the planner's single modes best first, at most ``MAX_CANDIDATES``,
    then its first combination of n-gram lookup with a model draft.

    An MTP head with a p-min gets a second try without it when there is room: the model cards
    disagree on it per model (the dense 27B wants 0.75, the MoE 0), and only a measurement
    knows this file. A forced mode is measured as planned, against none.
    """
    found = [trial_of(c.spec_type, c.draft_max, c.p_min) for c in candidates]
    if forced:
        return (OFF_TRIAL, *found[:1])
    single = [t for t in found if not is_combined(t.spec_type or "")]
    both = [t for t in found if is_combined(t.spec_type or "")]
    first = single[0] if single else None
    if first is not None and first.spec_type == "draft-mtp" and first.p_min:
        single.insert(1, trial_of(first.spec_type, first.draft_max, 0.0))
    return (OFF_TRIAL, *single[:MAX_CANDIDATES], *both[:MAX_COMBINATIONS])


def missing(
    trials: Sequence[Trial],
    measurement: Measurement | None,
    running: str,
    again: Collection[str] = (),
) -> list[Trial]:
    """The trials the store has no rate for (or one due again: the served mix moved), and those
    labelled ``again`` (too close to call after their runs so far), the configuration running
    now first (it needs no restart)."""
    todo = [
        t
        for t in trials
        if measurement is None or not measurement.fresh(t.label) or t.label in again
    ]
    return sorted(todo, key=lambda t: t.label != running)


@dataclass(frozen=True)
class CloseCall:
    """The two fastest configurations, too close for their runs so far to tell apart."""

    labels: tuple[str, str]
    gap: float
    """How much faster the faster is, a share of the slower's rate."""
    runs: int
    """The fewer runs of the probe set of the two."""

    def text(self) -> str:
        """``ngram-mod and off are within their runs' spread``."""
        pair = " and ".join(self.labels)
        if self.runs < 2:
            return f"{pair} are within {self.gap:.0%} of each other, closer than one run tells"
        return f"{pair} are within their runs' spread"


def too_close(measurement: Measurement, labels: Sequence[str]) -> CloseCall | None:
    """The two fastest of ``labels`` (none among them) where both run the probes again before
    the verdict stands: closer than ``UNSURE_GAP`` after one run each, or than their spread
    after more, and neither has run ``MAX_RUNS`` times; None when the verdict stands."""
    rates = [t for label in labels if (t := measurement.trial(label)) is not None]
    ranked = sorted(rates, key=measurement.rate, reverse=True)
    if len(ranked) < 2 or measurement.rate(ranked[1]) <= 0:
        return None
    fast, slow = ranked[:2]
    gap = measurement.rate(fast) / measurement.rate(slow) - 1
    spreads, runs = zip(*(measurement.rate_spread(t.label) for t in (fast, slow)), strict=True)
    if not RULE.needs_another_run(gap, runs, spreads):
        return None
    return CloseCall((fast.label, slow.label), gap, min(runs))


def probe_rate(name: str, timings: Mapping[str, object], weight: int = 0) -> ProbeRate | None:
    """One reply's decode from the engine's ``timings``, ``weight`` the tokens the probe asked
    for; None when it decoded nothing."""
    tokens, ms = timings.get("predicted_n"), timings.get("predicted_ms")
    if not isinstance(tokens, int | float) or not isinstance(ms, int | float) or tokens < 1:
        return None
    drafted, accepted = timings.get("draft_n"), timings.get("draft_n_accepted")
    prompt = [timings.get("prompt_n"), timings.get("cache_n")]
    prompt_ms = timings.get("prompt_ms")
    return ProbeRate(
        name,
        int(tokens),
        float(ms) / 1000,
        int(drafted) if isinstance(drafted, int | float) else 0,
        int(accepted) if isinstance(accepted, int | float) else 0,
        weight,
        sum(int(n) for n in prompt if isinstance(n, int | float)),
        float(prompt_ms) / 1000 if isinstance(prompt_ms, int | float) else 0.0,
    )


def describe_trial(measurement: Measurement, trial: TrialRate) -> str:
    """``draft-mtp n3 p0.75 0.65x (drafted nothing)``: a rate against none, its runs' spread
    where it ran more than once, and why."""
    ratio = measurement.ratio(trial.label)
    text = f"{trial.label} {ratio:.2f}x" if ratio is not None else f"{trial.label} unmeasured"
    spread, runs = measurement.rate_spread(trial.label)
    if runs > 1:
        text += f" ±{spread / 2:.0%} over {runs} runs"
    if trial.spec_type is not None and trial.drafted == 0:
        text += " (drafted nothing)"
    elif trial.drafted:
        text += f" ({trial.accepted / trial.drafted:.0%} accepted)"
    return text


def _spreads(measurement: Measurement, *trials: TrialRate) -> list[float]:
    return [measurement.rate_spread(t.label)[0] for t in trials]


def _wins(measurement: Measurement, trial: TrialRate, over: TrialRate) -> bool:
    """Whether ``trial`` is faster than ``over`` by more than the margin and their spread."""
    margin = RULE.margin(_spreads(measurement, trial, over))
    return measurement.rate(trial) > measurement.rate(over) * (1 + margin)


def verdict(measurement: Measurement, labels: Sequence[str]) -> tuple[str, str]:
    """The label to serve among ``labels`` (all measured, none included), and why."""
    base = measurement.baseline
    rates = [t for label in labels if (t := measurement.trial(label)) is not None]
    if base is None or measurement.rate(base) <= 0:
        return OFF, "no rate without speculation was measured"
    others = [t for t in rates if t.label != OFF]
    best = max(others, key=measurement.rate, default=None)
    single = [t for t in others if not is_combined(t.spec_type or "")]
    best_single = max(single, key=measurement.rate, default=None)
    simpler = ""
    # A combination adds a second drafter: kept only where it clearly beats the best alone.
    if (
        best is not None
        and best_single is not None
        and best is not best_single
        and not _wins(measurement, best, best_single)
    ):
        within = RULE.within(_spreads(measurement, best, best_single))
        simpler = f"; {best.label} is within {within} of {best_single.label}"
        best = best_single
    over = f"measured on this card over {len(base.probes)} probes"
    if measurement.remeasure_why:
        # Says why speculation came back on (or stayed off) after the workload changed.
        over = f"re-{over} weighed as served, because {measurement.remeasure_why};"
    rest = ", ".join(describe_trial(measurement, t) for t in others)
    none = " none" if measurement.remeasure_why else ", none"
    if best is None or measurement.rate(best) <= measurement.rate(base):
        return OFF, f"{over}{none} is faster: {rest}"
    if not _wins(measurement, best, base):
        within = RULE.within(_spreads(measurement, best, base))
        return OFF, f"{over}{none} serves, {best.label} within {within}: {rest}"
    return best.label, f"{over} against none: {rest}{simpler}"


def measured_rate(measurement: Measurement, label: str) -> MeasuredRate | None:
    """``label``'s measured rate against none, as `status` shows it."""
    base, trial = measurement.baseline, measurement.trial(label)
    ratio = measurement.ratio(label)
    if base is None or trial is None or ratio is None:
        return None
    return MeasuredRate(
        round(measurement.rate(base), 1),
        round(measurement.rate(trial), 1),
        round(ratio, 3),
        len(trial.probes),
        trial.at,
    )


def shown_off(measurement: Measurement, label: str) -> SpecStatus | None:
    """Speculation the measurement switched off, as status shows it: the mode the planner
    would have chosen, its measured ratio and why (``off: drafted nothing, 0.65x``)."""
    trial = measurement.trial(label)
    if trial is None or trial.spec_type is None:
        return None
    ratio = measurement.ratio(label) or 0.0
    base = measurement.baseline
    if trial.drafted == 0:
        cause = "drafted nothing"
    elif ratio <= 1 or base is None:
        cause = "slower than none"
    else:
        cause = f"within {RULE.within(_spreads(measurement, trial, base))} of none"
    return SpecStatus(
        trial.spec_type,
        False,
        f"off: {cause}, {ratio:.2f}x ({measurement.why})",
        trial.accepted / trial.drafted if trial.drafted else None,
        None,
        measured_rate(measurement, label),
    )


def sampled_at(
    mix: SamplingStatus | None, measured_at: str = samplingdefaults.GREEDY
) -> str | None:
    """The sampling a sampled reply's speed-up is read at: the served mix's typical
    temperature, else the one the calibration measures at when that is sampled; None when
    nothing is sampled."""
    if mix is not None and mix.temperature > 0:
        return samplingdefaults.label(mix.temperature)
    return None if measured_at == samplingdefaults.GREEDY else measured_at


def by_sampling(
    measured: Mapping[str, Measurement | None],
    running: str,
    mix: SamplingStatus | None,
    sampled: str | None,
) -> tuple[SamplingRate, ...]:
    """Greedy and sampled replies apart: the speed-up of the ``running`` configuration where
    ``measured`` (by sampling) holds one, with its runs' spread, and the acceptance as the
    front counted it; each only where there is a figure."""
    rows = (
        (False, samplingdefaults.GREEDY, mix.greedy_acceptance if mix else None),
        (True, sampled, mix.sampled_acceptance if mix else None),
    )
    found = []
    for is_sampled, at, acceptance in rows:
        if at is None:
            continue
        measurement = measured.get(at)
        ratio = measurement.ratio(running) if measurement and running != OFF else None
        spread, runs = (0.0, 1)
        if measurement is not None and ratio is not None:
            spread, runs = measurement.ratio_spread(running)
        if ratio is not None or acceptance is not None:
            found.append(SamplingRate(is_sampled, at, ratio, acceptance, spread, runs))
    return tuple(found)
