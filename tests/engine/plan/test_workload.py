"""The served mix against the probes' (pure, on fixed numbers): when it has moved enough for a
re-measure, the verdict the re-measure weighs by the served mix, and the calibration's watch
that marks the stored measurement due again (no engine, no timing)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.plan.speculation.measurements import (
    OFF,
    Measurement,
    MeasurementKey,
    ProbeRate,
    TrialRate,
    read_measurement,
    write_measurement,
)
from lucebox.engine.plan.speculation.speculation import SpecCandidate
from lucebox.engine.plan.speculation.workload import (
    MIN_MIX_REQUESTS,
    ServedRequest,
    mix_moved,
    nearest_probe,
    probe_mix,
    served_mix,
)
from lucebox.engine.run.calibrate import calibration
from lucebox.engine.run.calibrate.calibrator import CalibrationSetup, Calibrator
from lucebox.engine.run.calibrate.probing import ProbePace
from lucebox.engine.run.sample import SpecStatus

KEY = MeasurementKey("t.gguf:1:ab", None, "cpu b11434", "CPU", 4096, "f16/f16")
# Probe lengths of the shape the four probes have (prompt tokens with the chat template, reply
# tokens), the weights they ask for, and per-probe rates of an n-gram mode that loses on chat
# and code (0.7x) and gains on the edit (1.6x): 1.00x over the probes' own mix.
SHAPES = {"chat": (40, 96, 96), "code": (45, 192, 192), "edit": (300, 220, 320),
          "agent": (330, 110, 160)}  # fmt: skip
NGRAM_GAIN = {"chat": 0.7, "code": 0.7, "edit": 1.6, "agent": 1.0}
NONE_TOK_S = 30.0


def trial(label: str, *, with_lengths: bool = True, at: float = 1.0) -> TrialRate:
    probes = []
    for name, (prompt, reply, asked) in SHAPES.items():
        tok_s = NONE_TOK_S * (NGRAM_GAIN[name] if label != OFF else 1.0)
        drafted = 0 if label == OFF else 40
        probes.append(
            ProbeRate(
                name, reply, reply / tok_s, drafted, drafted // 2, asked, prompt * with_lengths
            )
        )
    spec_type = None if label == OFF else "ngram-mod"
    return TrialRate(label, spec_type, None, None, tuple(probes), at)


def measured(**options: object) -> Measurement:
    m = Measurement(KEY).with_trial(trial(OFF, **options)).with_trial(trial("ngram-mod", **options))  # type: ignore[arg-type]
    chosen, why = calibration.verdict(m, [OFF, "ngram-mod"])
    return replace(m, chosen=chosen, why=why)


def edits(count: int) -> list[ServedRequest]:
    """Whole-file edits: a long prompt, a reply nearly as long."""
    return [ServedRequest(2000, 1500, 1500 / NONE_TOK_S) for _ in range(count)]


def chats(count: int) -> list[ServedRequest]:
    return [ServedRequest(30, 120, 4.0) for _ in range(count)]


def agent_turns(count: int) -> list[ServedRequest]:
    """Tool output read back: a long prompt, a short reply."""
    return [ServedRequest(3000, 80, 3.0) for _ in range(count)]


def test_requests_match_the_probe_nearest_in_prompt_and_reply_length():
    shapes = measured().baseline.shapes()  # type: ignore[union-attr]
    assert nearest_probe(edits(1)[0], shapes) == "edit"
    assert nearest_probe(agent_turns(1)[0], shapes) == "agent"
    assert nearest_probe(chats(1)[0], shapes) == "chat"
    mix = served_mix([*edits(3), *chats(1)], shapes)
    assert mix == {"chat": 120 / 4620, "code": 0.0, "edit": 4500 / 4620, "agent": 0.0}


def test_on_the_probes_own_mix_n_gram_ties_with_none_and_stays_off():
    m = measured()
    assert m.chosen == OFF and round(m.ratio("ngram-mod") or 0, 3) == 0.996
    assert probe_mix(m.baseline.shapes()) == pytest.approx(  # type: ignore[union-attr]
        {"chat": 0.125, "code": 0.25, "edit": 0.4167, "agent": 0.2083}, abs=1e-4
    )


def test_a_mix_like_the_measured_one_or_too_few_requests_call_for_nothing():
    m = measured()
    shapes, weighed = m.baseline.shapes(), m.weighed_mix()  # type: ignore[union-attr]
    like_probes = [*chats(4), *edits(1), *agent_turns(12)] * 2
    assert mix_moved(like_probes, shapes, weighed) is None
    assert mix_moved(edits(MIN_MIX_REQUESTS - 1), shapes, weighed) is None


def test_an_edit_heavy_mix_calls_for_a_re_measure_and_says_why():
    m = measured()
    moved = mix_moved(edits(MIN_MIX_REQUESTS), m.baseline.shapes(), m.weighed_mix())  # type: ignore[union-attr]
    assert moved is not None
    mix, why = moved
    assert mix["edit"] == 1.0
    assert why == (
        "the served mix moved 58% from the measured one over the last 16 requests "
        "(served edit 100%; measured edit 42%, code 25%, agent 21%, chat 12%)"
    )


def test_probes_stored_before_their_prompt_lengths_were_kept_call_for_nothing():
    m = measured(with_lengths=False)
    assert mix_moved(edits(32), m.baseline.shapes(), m.weighed_mix()) is None  # type: ignore[union-attr]
    curve = m.baseline_curve()
    assert (
        curve is not None
        and curve.points == ()
        and curve.overall_tok_s == pytest.approx(NONE_TOK_S)
    )


def test_the_re_measure_weighs_the_served_mix_and_n_gram_comes_back_with_the_reason():
    m = measured()
    mix = {"chat": 0.1, "code": 0.0, "edit": 0.8, "agent": 0.1}
    due = m.remeasure(mix, "the served mix moved", at=5.0)
    trials = calibration.trials_for(
        [SpecCandidate("ngram-mod", False, None, None, "")], forced=False
    )
    assert [t.label for t in calibration.missing(trials, due, OFF)] == [OFF, "ngram-mod"]
    again = due.with_trial(trial(OFF, at=6.0)).with_trial(trial("ngram-mod", at=6.0))
    assert calibration.missing(trials, again, OFF) == []
    chosen, why = calibration.verdict(again, [OFF, "ngram-mod"])
    assert chosen == "ngram-mod" and round(again.ratio("ngram-mod") or 0, 3) == 1.346
    assert why == (
        "re-measured on this card over 4 probes weighed as served, because the served mix "
        "moved; against none: ngram-mod 1.35x (50% accepted)"
    )


def test_the_stored_mix_and_due_time_round_trip_and_older_entries_read(lucebox_home: Path):
    paths = resolve_paths({"LUCEBOX_HOME": str(lucebox_home)})
    due = measured().remeasure({"edit": 1.0}, "moved", at=5.0)
    write_measurement(paths, due)
    assert read_measurement(paths, KEY) == due
    old = Measurement.from_json(
        {"key": vars(KEY), "trials": [{"label": OFF, "probes": [
            {"name": "chat", "tokens": 96, "decode_s": 3.2, "drafted": 0, "accepted": 0,
             "weight": 96}], "at": 1.0}], "chosen": OFF, "why": ""}
    )  # fmt: skip
    assert old is not None and old.mix == () and old.remeasure_at == 0.0
    assert old.baseline is not None and old.baseline.probes[0].prompt_tokens == 0


def test_the_calibration_marks_its_measurement_due_once_the_served_mix_moved(
    lucebox_home: Path,
):
    paths = resolve_paths({"LUCEBOX_HOME": str(lucebox_home)})
    write_measurement(paths, measured())
    candidates = [SpecCandidate("ngram-mod", False, None, None, "")]
    setup = CalibrationSetup(
        KEY, calibration.trials_for(candidates, forced=False), False, ProbePace(30.0), False,
        lambda _trial: None, lambda: None,
    )  # fmt: skip
    watch = Calibrator(paths, setup)
    states = [watch.state]
    watch.observe(edits(MIN_MIX_REQUESTS - 1))
    states.append(watch.state)
    watch.observe(edits(1))
    assert [*states, watch.state] == ["done", "done", "waiting"]
    assert not watch.complete
    stored = read_measurement(paths, KEY)
    assert stored is not None and stored.remeasure_why.startswith("the served mix moved 58%")
    assert stored.chosen == OFF  # the verdict serves until the re-measure replaces it
    shown = watch.spec_view(OFF, SpecStatus("ngram-mod", False, "", None, None))
    assert shown is not None and "; re-measuring once idle, because the served mix moved" in (
        shown.reason
    )
