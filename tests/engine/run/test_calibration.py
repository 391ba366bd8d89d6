"""The calibration's choice on recorded numbers (no timing here): the H100 figures of issue 30
and CPU ones, the trial set per candidate list, resuming, and what status shows."""

from __future__ import annotations

from dataclasses import replace

from lucebox.engine.plan.speculation.measurements import (
    OFF,
    Measurement,
    MeasurementKey,
    ProbeRate,
    TrialRate,
)
from lucebox.engine.plan.speculation.speculation import SpecCandidate
from lucebox.engine.run.calibrate import calibration
from lucebox.engine.run.calibrate.calibration import OFF_TRIAL, trial_of, trials_for

KEY = MeasurementKey("t.gguf:1:ab", None, "llama.cpp-b11434-cuda b11434", "H100", 8192, "f16/f16")
MTP = SpecCandidate("draft-mtp", False, 3, 0.75, "head")
NGRAM = SpecCandidate("ngram-mod", False, None, None, "ngram")
DFLASH = SpecCandidate("draft-dflash", True, 15, None, "draft")


def rate(
    label: str, tok_s: float, *, drafted: int = 0, accepted: int = 0, tokens: int = 512
) -> TrialRate:
    """A trial whose probes decoded ``tokens`` in all at ``tok_s`` (as recorded)."""
    spec_type = None if label == OFF else label.split()[0]
    half = tokens // 2
    probes = (
        ProbeRate("chat", half, half / tok_s, drafted // 2, accepted // 2),
        ProbeRate("edit", tokens - half, (tokens - half) / tok_s, drafted - drafted // 2,
                  accepted - accepted // 2),
    )  # fmt: skip
    return TrialRate(label, spec_type, None, None, probes, 1.0)


def measured(*trials: TrialRate) -> Measurement:
    found = Measurement(KEY)
    for trial in trials:
        found = found.with_trial(trial)
    return found


def test_an_agreeing_mtp_head_wins_with_its_measured_ratio():
    # H100, issue 30: 1,100 tok/s with the head vs 690 without, 383/383 accepted.
    m = measured(rate(OFF, 690), rate("draft-mtp n3 p0.75", 1100, drafted=383, accepted=383))
    chosen, why = calibration.verdict(m, [OFF, "draft-mtp n3 p0.75"])
    assert chosen == "draft-mtp n3 p0.75"
    assert why == (
        "measured on this card over 2 probes against none: draft-mtp n3 p0.75 1.59x (100% accepted)"
    )
    shown = calibration.measured_rate(m, chosen)
    assert shown is not None and shown.ratio == 1.594 and shown.baseline_tok_s == 690


def test_a_head_that_drafts_nothing_yet_costs_speed_is_switched_off_with_the_reason():
    # H100, issue 30: p-min 0.75 never passed, no draft proposed, 440 tok/s vs 680 off.
    m = measured(rate(OFF, 680), rate("draft-mtp n3 p0.75", 440))
    chosen, why = calibration.verdict(m, [OFF, "draft-mtp n3 p0.75"])
    assert chosen == OFF
    assert "none is faster: draft-mtp n3 p0.75 0.65x (drafted nothing)" in why
    status = calibration.shown_off(replace(m, chosen=chosen, why=why), "draft-mtp n3 p0.75")
    assert status is not None and status.active is False and status.type == "draft-mtp"
    assert status.reason.startswith("off: drafted nothing, 0.65x")
    assert status.measured is not None and status.measured.ratio == 0.647


def test_a_tie_goes_to_no_speculation():
    m = measured(rate(OFF, 100.0), rate("ngram-mod", 102.5, drafted=50, accepted=10))
    assert calibration.verdict(m, [OFF, "ngram-mod"])[0] == OFF
    m = measured(rate(OFF, 100.0), rate("ngram-mod", 104.0, drafted=50, accepted=40))
    assert calibration.verdict(m, [OFF, "ngram-mod"])[0] == "ngram-mod"


def test_decode_is_token_weighted_so_a_long_reply_counts_by_its_tokens():
    # 300 tokens at 30 tok/s and 10 at 100 tok/s: 310 tokens in 10.1 s, not the mean of rates.
    trial = TrialRate(
        "ngram-mod", "ngram-mod", None, None,
        (ProbeRate("edit", 300, 10.0), ProbeRate("chat", 10, 0.1)), 1.0,
    )  # fmt: skip
    assert round(trial.tok_s, 2) == 30.69


def test_the_fastest_of_several_wins_and_only_the_planned_set_counts():
    m = measured(
        rate(OFF, 680),
        rate("draft-mtp n3 p0.75", 700, drafted=90, accepted=30),
        rate("draft-mtp n3 p0", 760, drafted=900, accepted=500),
        rate("ngram-mod", 690),
        rate("draft-dflash n15", 2000),  # measured under a forced mode, not an auto candidate
    )
    labels = [OFF, "draft-mtp n3 p0.75", "draft-mtp n3 p0", "ngram-mod"]
    chosen, why = calibration.verdict(m, labels)
    assert chosen == "draft-mtp n3 p0"
    assert "draft-mtp n3 p0 1.12x" in why and "(56% accepted)" in why


def test_an_mtp_head_with_a_p_min_is_also_tried_without_one_within_three_candidates():
    trials = trials_for([MTP, NGRAM], forced=False)
    assert [t.label for t in trials] == [OFF, "draft-mtp n3 p0.75", "draft-mtp n3 p0", "ngram-mod"]
    assert trials[2].mode == "mtp" and trials[2].p_min == 0.0
    four = trials_for([MTP, DFLASH, NGRAM], forced=False)
    assert [t.label for t in four][1:] == [
        "draft-mtp n3 p0.75",
        "draft-mtp n3 p0",
        "draft-dflash n15",
    ]


def test_on_a_cpu_the_candidates_are_ngram_and_the_named_draft():
    trials = trials_for([DFLASH, NGRAM], forced=False)
    assert [(t.label, t.mode) for t in trials] == [
        (OFF, "off"),
        ("draft-dflash n15", "dflash"),
        ("ngram-mod", "ngram"),
    ]


def test_a_forced_mode_is_measured_against_none_only():
    assert trials_for([MTP], forced=True) == (OFF_TRIAL, trial_of("draft-mtp", 3, 0.75))


def test_a_calibration_resumes_with_what_it_lacks_the_running_one_first():
    trials = trials_for([DFLASH, NGRAM], forced=False)
    m = measured(rate(OFF, 50))
    todo = calibration.missing(trials, m, running="ngram-mod")
    assert [t.label for t in todo] == ["ngram-mod", "draft-dflash n15"]
    assert calibration.missing(trials, None, running=OFF)[0] == OFF_TRIAL


def test_probe_rates_come_from_the_engines_timings():
    timings = {"predicted_n": 64, "predicted_ms": 800.0, "draft_n": 30, "draft_n_accepted": 24}
    assert calibration.probe_rate("edit", timings) == ProbeRate("edit", 64, 0.8, 30, 24)
    # The whole prompt the reply decoded after: processed and cached tokens.
    timings.update(prompt_n=280, cache_n=12)
    assert calibration.probe_rate("edit", timings, 320) == ProbeRate(
        "edit", 64, 0.8, 30, 24, 320, 292
    )
    assert calibration.probe_rate("chat", {"predicted_n": 0, "predicted_ms": 0}) is None
    assert calibration.probe_rate("chat", {}) is None


def test_each_probe_weighs_what_it_asked_for_so_a_reply_ending_sooner_gains_nothing():
    # The speculating engine's numerics differ a little: its agent reply ended after 10 tokens.
    def trial(label: str, agent_tokens: int) -> TrialRate:
        probes = (
            ProbeRate("chat", 100, 1.0, weight=100),  # 100 tok/s either way
            ProbeRate("agent", agent_tokens, agent_tokens / 50, weight=100),  # 50 tok/s
        )
        return TrialRate(label, None if label == OFF else "ngram-mod", None, None, probes, 1.0)

    m = measured(trial(OFF, 100), trial("ngram-mod", 10))
    assert round(m.ratio("ngram-mod") or 0, 3) == 1.0  # by decoded tokens it would be 1.37x
    assert calibration.verdict(m, [OFF, "ngram-mod"])[0] == OFF


BOTH = SpecCandidate("ngram-mod,draft-mtp", False, 3, 0.75, "both")


def test_the_combination_is_measured_in_a_place_of_its_own():
    trials = trials_for([MTP, NGRAM, BOTH], forced=False)
    assert [t.label for t in trials] == [
        OFF,
        "draft-mtp n3 p0.75",
        "draft-mtp n3 p0",
        "ngram-mod",
        "ngram-mod,draft-mtp n3 p0.75",
    ]
    assert (trials[-1].mode, trials[-1].spec_type) == ("mtp", "ngram-mod,draft-mtp")
    # A forced mode is measured as planned, against none: no combination.
    assert trials_for([MTP, BOTH], forced=True) == (OFF_TRIAL, trial_of("draft-mtp", 3, 0.75))


def test_the_combination_is_kept_only_where_it_beats_the_best_single_mode_too():
    labels = [OFF, "draft-mtp n3", "ngram-mod", "ngram-mod,draft-mtp n3"]
    close = measured(
        rate(OFF, 100.0),
        rate("draft-mtp n3", 150.0, drafted=90, accepted=80),
        rate("ngram-mod", 120.0, drafted=50, accepted=40),
        rate("ngram-mod,draft-mtp n3", 154.0, drafted=200, accepted=180),
    )
    assert calibration.verdict(close, labels)[0] == "draft-mtp n3"  # a tie: the simpler
    clear = replace(close).with_trial(rate("ngram-mod,draft-mtp n3", 170.0, drafted=200))
    chosen, why = calibration.verdict(clear, labels)
    assert chosen == "ngram-mod,draft-mtp n3" and "ngram-mod,draft-mtp n3 1.70x" in why
    # Faster than the single modes yet no faster than none: none.
    slow = measured(rate(OFF, 100.0), rate("ngram-mod,draft-mtp n3", 102.0, drafted=10))
    assert calibration.verdict(slow, [OFF, "ngram-mod,draft-mtp n3"])[0] == OFF
