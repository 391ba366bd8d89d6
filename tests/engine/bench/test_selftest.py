"""The self-test's speed verdict: the candidate within noise of the current build, or not."""

from __future__ import annotations

from lucebox.engine.bench.selftest import SPEED_NOISE, Speed, speed_verdict


def test_a_candidate_within_noise_passes_and_a_slower_one_is_named():
    current = Speed(50.0, 400.0)
    assert speed_verdict(current, Speed(50.0 * (1 - SPEED_NOISE) + 0.1, 400.0)).passed
    slow = speed_verdict(current, Speed(30.0, 400.0))
    assert not slow.passed and slow.name == "speed"
    assert "decode 30.0 tok/s against 50.0" in slow.detail and "prefill" not in slow.detail


def test_a_rate_the_candidate_does_not_report_fails_and_one_neither_reports_is_skipped():
    assert not speed_verdict(Speed(50.0, 400.0), Speed(50.0, None)).passed
    assert speed_verdict(Speed(50.0, None), Speed(55.0, None)).passed


def test_each_rate_is_its_best_round():
    from lucebox.engine.bench.selftest import best_of

    assert best_of([Speed(40.0, None), Speed(35.0, 300.0)]) == Speed(40.0, 300.0)


def test_the_current_build_measured_twice_counts_its_slower_rates():
    from lucebox.engine.bench.selftest import worst_of

    assert worst_of([Speed(40.0, 300.0), Speed(45.0, 250.0)]) == Speed(40.0, 250.0)
