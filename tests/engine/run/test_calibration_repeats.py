"""The speculation verdict knows its spread: the two fastest (none among them) run the probes
again while they are too close to call, each run kept in the store, and a mode serves (or a
combination over a single mode) only when it wins by more than the margin and the runs' spread.
On recorded numbers, and through the calibrator with its measuring stubbed by them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.plan.samplingdefaults import SamplingDefaults
from lucebox.engine.plan.speculation.measurements import (
    OFF,
    Measurement,
    TrialRate,
    read_measurement,
)
from lucebox.engine.run.calibrate import calibration
from lucebox.engine.run.calibrate.calibration import MAX_RUNS, UNSURE_GAP, too_close, trials_for
from lucebox.engine.run.calibrate.calibrator import CalibrationSetup, Calibrator
from lucebox.engine.run.calibrate.probing import ProbePace
from lucebox.engine.run.front.samplingmix import SamplingMix
from tests.engine.run.test_calibration import DFLASH, KEY, NGRAM, measured, rate

COMBINED = "ngram-mod,draft-mtp n3"


def runs(label: str, *tok_s: float, drafted: int = 100, accepted: int = 50) -> TrialRate:
    """``label`` run once at each of ``tok_s``, the first run the earliest."""
    trial = rate(label, tok_s[0], drafted=drafted, accepted=accepted)
    for later in tok_s[1:]:
        trial = trial.with_run(rate(label, later, drafted=drafted, accepted=accepted))
    return trial


def test_after_one_run_each_the_two_fastest_run_again_where_they_are_close():
    labels = [OFF, "draft-dflash n15", "ngram-mod"]
    near = measured(runs(OFF, 100.0), runs("draft-dflash n15", 50.0), runs("ngram-mod", 104.0))
    call = too_close(near, labels)
    assert call is not None and call.labels == ("ngram-mod", OFF) and call.runs == 1
    assert call.text() == "ngram-mod and off are within 4% of each other, closer than one run tells"
    # Far apart: the verdict stands after one run each.
    gap = 1 + UNSURE_GAP + 0.01
    far = near.with_trial(runs("ngram-mod", 100.0 * gap))
    assert too_close(far, labels) is None
    # The two fastest may both be modes: the combination against the best alone.
    modes = measured(runs(OFF, 100.0), runs("draft-mtp n3", 150.0), runs(COMBINED, 154.0))
    call = too_close(modes, [OFF, "draft-mtp n3", COMBINED])
    assert call is not None and call.labels == (COMBINED, "draft-mtp n3")


def test_after_more_runs_they_run_again_only_within_their_spread_and_at_most_max_runs():
    labels = [OFF, "ngram-mod"]
    # Two runs each: n-gram 100 then 112 (mean 106, 11% apart), 6% over none's 100 and 100.
    wide = measured(runs(OFF, 100.0, 100.0), runs("ngram-mod", 100.0, 112.0))
    assert wide.rate_spread("ngram-mod") == pytest.approx((12 / 106, 2))
    call = too_close(wide, labels)
    assert call is not None and call.text() == "ngram-mod and off are within their runs' spread"
    # Runs that agree: 6% stands beyond them.
    tight = measured(runs(OFF, 100.0, 100.0), runs("ngram-mod", 105.0, 107.0))
    assert too_close(tight, labels) is None
    # No more than MAX_RUNS, whatever the gap.
    most = measured(runs(OFF, *[100.0] * MAX_RUNS), runs("ngram-mod", 100.0, 112.0, 106.0))
    assert too_close(most, labels) is None


def test_a_mode_within_the_runs_spread_leaves_none_serving_and_says_so():
    labels = [OFF, "ngram-mod"]
    wide = measured(runs(OFF, 100.0, 100.0), runs("ngram-mod", 100.0, 112.0))
    chosen, why = calibration.verdict(wide, labels)
    assert chosen == OFF
    assert why == (
        "measured on this card over 2 probes, none serves, ngram-mod within the 11% runs' "
        "spread: ngram-mod 1.06x ±6% over 2 runs (50% accepted)"
    )
    shown = calibration.shown_off(Measurement(KEY, wide.trials, chosen, why), "ngram-mod")
    assert shown is not None
    assert shown.reason.startswith("off: within the 11% runs' spread of none, 1.06x")
    # The same 6% from runs that agree clears the 3% tie margin: n-gram serves.
    tight = measured(runs(OFF, 100.0, 100.0), runs("ngram-mod", 105.0, 107.0))
    assert calibration.verdict(tight, labels)[0] == "ngram-mod"
    # One run each, 2% apart: within the tie margin, said as such.
    once = measured(runs(OFF, 100.0), runs("ngram-mod", 102.0))
    assert "none serves, ngram-mod within the 3% tie margin" in calibration.verdict(once, labels)[1]


def test_a_combination_must_clear_the_runs_spread_over_the_best_single_mode():
    labels = [OFF, "draft-mtp n3", COMBINED]
    mtp = runs("draft-mtp n3", 150.0, 150.0)
    # 148 then 172: 7% over the head alone on average, within their 15% spread.
    wide = measured(runs(OFF, 100.0), mtp, runs(COMBINED, 148.0, 172.0))
    chosen, why = calibration.verdict(wide, labels)
    assert chosen == "draft-mtp n3"
    assert why.endswith(f"; {COMBINED} is within the 15% runs' spread of draft-mtp n3")
    tight = measured(runs(OFF, 100.0), mtp, runs(COMBINED, 158.0, 162.0))
    assert calibration.verdict(tight, labels)[0] == COMBINED


class Run:
    """What the calibrator needs of a run: a ready engine without speculation, an idle front."""

    url = "http://engine"
    api_key = None

    def __init__(self) -> None:
        activity = SimpleNamespace(activity=lambda: (0, 0))
        mix = SamplingMix(SamplingDefaults(0.0, 1.0, 0, 0.0, "preset"))
        self.front = SimpleNamespace(queue=activity, sampling=mix)
        launch = SimpleNamespace(spec_type=None, draft_max=None, draft_p_min=None)
        self.supervisor = SimpleNamespace(launch=launch)
        self.status = SimpleNamespace(state="ready")


async def calibrate(tmp_path, rates: dict[str, list[float]]) -> tuple[Calibrator, list[str]]:
    """A calibration of none, a draft and n-gram lookup whose runs measure ``rates`` (each
    label's in turn); what it measured in order, and the reason status showed for each."""
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path)})
    trials = trials_for([DFLASH, NGRAM], forced=False)
    setup = CalibrationSetup(
        KEY, trials, False, ProbePace(0.0), False, lambda t: None, lambda: None
    )
    calibrator = Calibrator(paths, setup)
    shown: list[str] = []

    async def measure(client, server, trial, running) -> TrialRate:
        view = calibrator.spec_view(OFF, None)
        shown.append(f"{trial.label}: {view.reason if view else ''}")
        return rate(trial.label, rates[trial.label].pop(0), drafted=100, accepted=50)

    calibrator._measure = measure  # type: ignore[method-assign]
    await calibrator._calibrate(Run())  # type: ignore[arg-type]
    return calibrator, shown


async def test_the_calibrator_runs_a_close_pair_again_and_keeps_every_run(tmp_path):
    rates = {
        OFF: [100.0, 100.0, 100.0],
        "draft-dflash n15": [50.0],
        "ngram-mod": [103.0, 111.0, 104.0],
    }
    calibrator, shown = await calibrate(tmp_path, rates)
    order = [line.split(":")[0] for line in shown]
    # None first (it runs now), then the rest; then none and n-gram again, twice: 3% apart
    # after one run, then within n-gram's 7.5% spread after two.
    assert order == [OFF, "draft-dflash n15", "ngram-mod", OFF, "ngram-mod", OFF, "ngram-mod"]
    assert shown[3] == (
        "off: measuring again on this card: off (run 2 of at most 3), because ngram-mod and "
        "off are within 3% of each other, closer than one run tells"
    )
    assert shown[6].endswith(
        "(run 3 of at most 3), because ngram-mod and off are within their runs' spread"
    )
    stored = read_measurement(calibrator.paths, calibrator.setup.key)
    assert stored is not None and stored.rate_spread("ngram-mod") == pytest.approx((8 / 106, 3))
    assert stored.rate_spread("draft-dflash n15") == (0.0, 1)
    assert [t.label for t in stored.trials] == [OFF, "draft-dflash n15", "ngram-mod"]
    assert stored.chosen == OFF and "ngram-mod within the 8% runs' spread" in stored.why
    assert calibrator.state == "done" and calibrator.close is None


async def test_the_calibrator_lets_a_clear_verdict_stand_after_one_run(tmp_path):
    rates = {OFF: [100.0], "draft-dflash n15": [50.0], "ngram-mod": [130.0]}
    calibrator, shown = await calibrate(tmp_path, rates)
    assert [line.split(":")[0] for line in shown] == [OFF, "draft-dflash n15", "ngram-mod"]
    assert calibrator.measurement.chosen == "ngram-mod"
    assert calibrator.measurement.rate_spread("ngram-mod") == (0.0, 1)
