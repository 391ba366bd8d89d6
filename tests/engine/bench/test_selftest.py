"""The self-test's speed verdict (the candidate within noise of the current build, or not)
and the context both builds are served with."""

from __future__ import annotations

import dataclasses

import pytest

from lucebox.engine.bench.quick import PROMPTS
from lucebox.engine.bench.selftest import (
    NOISE_CAP,
    NOISE_FLOOR,
    SELF_TEST_MIN_CTX,
    Speed,
    noise_of,
    self_test_launch,
    speed_verdict,
)
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.pipeline import ServeOptions, prepare
from support.realmodels import smol_model


def test_a_candidate_within_noise_passes_and_a_slower_one_is_named():
    current = Speed(50.0, 400.0)
    assert speed_verdict(current, Speed(50.0 * (1 - 0.1) + 0.1, 400.0), 0.1).passed
    slow = speed_verdict(current, Speed(30.0, 400.0), 0.1)
    assert not slow.passed and slow.name == "speed"
    assert "decode 30.0 tok/s against 50.0" in slow.detail and "prefill" not in slow.detail
    assert "beyond its 10% noise" in slow.detail


def test_a_rate_the_candidate_does_not_report_fails_and_one_neither_reports_is_skipped():
    assert not speed_verdict(Speed(50.0, 400.0), Speed(50.0, None), 0.1).passed
    assert speed_verdict(Speed(50.0, None), Speed(55.0, None), 0.1).passed


def test_the_noise_is_the_spread_of_the_current_builds_rounds_between_floor_and_cap():
    # Prefill spread 10% (400 against 360), decode 4%: the larger one is the noise.
    rounds = [Speed(50.0, 400.0), Speed(48.0, 360.0), Speed(49.0, 380.0)]
    assert noise_of(rounds) == pytest.approx(0.10)
    assert noise_of([Speed(50.0, 400.0), Speed(49.9, 399.0)]) == NOISE_FLOOR
    assert noise_of([Speed(50.0, 400.0), Speed(20.0, 390.0)]) == NOISE_CAP
    assert noise_of([Speed(50.0, None)]) == NOISE_FLOOR  # one round tells no spread
    # The band follows the PC: 8% slower passes on a noisy run and fails on a quiet one.
    current, candidate = Speed(50.0, 400.0), Speed(46.0, 400.0)
    assert speed_verdict(current, candidate, noise_of(rounds)).passed
    quiet = [Speed(50.0, 400.0), Speed(49.5, 398.0), Speed(49.8, 401.0)]
    assert not speed_verdict(current, candidate, noise_of(quiet)).passed


def test_each_rate_is_its_best_round():
    from lucebox.engine.bench.selftest import best_of

    assert best_of([Speed(40.0, None), Speed(35.0, 300.0)]) == Speed(40.0, 300.0)


def test_the_current_build_measured_twice_counts_its_slower_rates():
    from lucebox.engine.bench.selftest import worst_of

    assert worst_of([Speed(40.0, 300.0), Speed(45.0, 250.0)]) == Speed(40.0, 250.0)


def test_a_small_context_is_raised_for_the_long_prompt_only_where_that_fits():
    """The real planner on SmolLM2 with a card's free memory given: at 870 MiB its 2,048 tokens
    fit and 8,192 do not (the window is about 820-925 MiB), at 4,000 MiB both fit."""
    paths = resolve_paths()
    notes: list[str] = []
    roomy = ServeOptions(model=str(smol_model()), ctx=2048, vram_mib=(4000,))
    options, prompts = self_test_launch(paths, roomy, notes.append)
    assert options.ctx == SELF_TEST_MIN_CTX and prompts == PROMPTS
    tight = dataclasses.replace(roomy, vram_mib=(870,))
    prepare(paths, tight, lambda event: None, dry_run=True)  # the user's own context fits
    options, prompts = self_test_launch(paths, tight, notes.append)
    assert options == tight
    assert [p.name for p in prompts] == [p.name for p in PROMPTS if p.name != "long"]
    assert "8192-token context does not fit here, so prefill is not compared" in notes[-1]
