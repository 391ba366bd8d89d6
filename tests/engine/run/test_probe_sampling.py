"""The calibrations' probes carry the served mix's sampling, and their rates are kept under that
sampling's key: greedy and sampled apart (the speculation's and the long-context modes')."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import httpx
import pytest

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.plan.lucebox import kvmodes
from lucebox.engine.plan.lucebox.kvmodes import KvModes, KvModesPlan
from lucebox.engine.plan.samplingdefaults import SamplingDefaults
from lucebox.engine.plan.speculation.measurements import (
    Measurement,
    MeasurementKey,
    ProbeRate,
    TrialRate,
    read_measurement,
    write_measurement,
)
from lucebox.engine.plan.speculation.workload import ServedRequest
from lucebox.engine.run.calibrate.calibration import by_sampling, sampled_at
from lucebox.engine.run.calibrate.calibrator import CalibrationSetup, Calibrator
from lucebox.engine.run.calibrate.kvcalibrator import KvModeCalibrator, KvSetup
from lucebox.engine.run.calibrate.probes import PROBES
from lucebox.engine.run.calibrate.probing import ProbePace
from lucebox.engine.run.front.samplingmix import PROBE_SEED, SamplingMix
from lucebox.engine.run.kinds.ownrequests import OwnRequests
from lucebox.engine.run.sample import SamplingRate, SpecStatus

KEY = MeasurementKey("m.gguf:1:ab", None, "pinned b1", "cpu", 4096, "f16/f16")
DEFAULTS = SamplingDefaults(0.6, 0.95, 20, 0.0, "preset")
TIMINGS = {"prompt_n": 10, "prompt_ms": 5.0, "predicted_n": 8, "predicted_ms": 40.0}


class Run:
    """What a calibration needs of a run, with the front's sampling tally."""

    url = "http://engine"

    def __init__(self, mix: SamplingMix) -> None:
        activity = SimpleNamespace(activity=lambda: (0, 0))
        self.front = SimpleNamespace(queue=activity, sampling=mix)
        self.supervisor = SimpleNamespace(own_requests=OwnRequests())

    async def keep_conversation(self) -> None:
        return None


def calibrator(tmp_path) -> Calibrator:
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path)})
    setup = CalibrationSetup(
        KEY, (), False, ProbePace(0.0), False, lambda trial: None, lambda: None
    )
    return Calibrator(paths, setup)


async def probe_body(measuring: Calibrator | KvModeCalibrator, run: Run) -> dict:
    sent: list[dict] = []

    def engine(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [], "timings": TIMINGS})

    if isinstance(measuring, Calibrator):
        measuring._follow_mix(run)  # type: ignore[arg-type]
    else:
        measuring._follow_sampling(run)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as client:
        rate = await measuring._probe(client, run, PROBES[0])  # type: ignore[arg-type]
    assert rate is not None and rate.tokens == 8
    return sent[0]


@pytest.mark.asyncio
async def test_probes_carry_the_mix_sampling_and_store_it_apart(tmp_path):
    mix = SamplingMix(DEFAULTS)
    measuring = calibrator(tmp_path)
    before = await probe_body(measuring, Run(mix))  # no request yet: the defaults stand in
    assert (before["temperature"], before["top_k"], before["seed"]) == (0.6, 20, PROBE_SEED)
    assert measuring.setup.key.sampling == "t0.6" and measuring.measurement.key.sampling == "t0.6"
    for _ in range(3):
        mix.record(json.dumps({"messages": [], "temperature": 0}).encode())
    greedy = await probe_body(measuring, Run(mix))
    assert greedy == {**greedy, "temperature": 0, "seed": PROBE_SEED} and "top_k" not in greedy
    assert measuring.setup.key.sampling == "greedy"
    assert measuring.setup.key.text() == KEY.text()  # greedy entries read as before


def test_greedy_and_sampled_rates_are_stored_apart(tmp_path):
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path)})
    sampled_key = replace(KEY, sampling="t0.7")
    write_measurement(paths, Measurement(KEY, chosen="off", why="greedy"))
    write_measurement(paths, Measurement(sampled_key, chosen="draft-mtp n3", why="sampled"))
    greedy, sampled = read_measurement(paths, KEY), read_measurement(paths, sampled_key)
    assert greedy is not None and greedy.chosen == "off" and greedy.key.sampling == "greedy"
    assert sampled is not None and sampled.chosen == "draft-mtp n3" and sampled.key == sampled_key


def figures(rate: SamplingRate) -> tuple[bool, str, float | None, float | None]:
    """A rate's figures, rounded as the dashboard shows them."""
    ratio, acceptance = (None if f is None else round(f, 3) for f in (rate.ratio, rate.acceptance))
    return rate.sampled, rate.at, ratio, acceptance


def state(measuring: KvModeCalibrator) -> str:
    return measuring.state


def _trial(label: str, spec_type: str | None, tok_s: float) -> TrialRate:
    probe = ProbeRate("chat", int(tok_s), 1.0, weight=int(tok_s))
    return TrialRate(label, spec_type, 3 if spec_type else None, None, (probe,), 1.0)


def test_greedy_and_sampled_speed_ups_show_apart_each_where_there_is_data(tmp_path):
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path)})
    mtp = "draft-mtp n3"
    for sampling, tok_s in (("greedy", 160.0), ("t0.7", 110.0)):
        trials = (_trial("off", None, 100.0), _trial(mtp, "draft-mtp", tok_s))
        write_measurement(paths, Measurement(replace(KEY, sampling=sampling), trials, mtp))
    measuring = calibrator(tmp_path)
    mix = SamplingMix(DEFAULTS)
    # The defaults' sampling (t0.6) was never measured, and nothing was served yet.
    assert [figures(r) for r in measuring.sampling_rates(mtp, mix.status())] == [
        (False, "greedy", 1.6, None)
    ]
    mix.record(json.dumps({"temperature": 0}).encode())
    mix.replied(True, 100, 90)
    mix.record(json.dumps({"temperature": 0.7}).encode())
    mix.replied(False, 100, 45)
    greedy, sampled = measuring.sampling_rates(mtp, mix.status())
    assert figures(greedy) == (False, "greedy", 1.6, 0.9)
    assert figures(sampled) == (True, "t0.7", 1.1, 0.45)
    assert sampled.text() == "sampled (t0.7) 1.10x measured, 45% accepted"
    assert measuring.sampling_rates("off", mix.status())[1].ratio is None  # nothing to gain


def test_a_speed_up_measured_over_several_runs_shows_their_spread():
    mtp = "draft-mtp n3"
    first, second = _trial(mtp, "draft-mtp", 150.0), _trial(mtp, "draft-mtp", 160.0)
    again = Measurement(KEY, (_trial("off", None, 100.0), first.with_run(second)), mtp)
    (greedy,) = by_sampling({"greedy": again}, mtp, None, None)
    assert (round(greedy.spread, 3), greedy.runs) == (0.065, 2)
    # The figure is the runs' mean, the spread beside it.
    assert greedy.text() == "greedy 1.55x measured ±3% over 2 runs"
    once = Measurement(KEY, (_trial("off", None, 100.0), second), mtp)
    assert by_sampling({"greedy": once}, mtp, None, None)[0].text() == "greedy 1.60x measured"


def test_a_run_without_calibration_shows_acceptance_by_sampling_alone():
    mix = SamplingMix(DEFAULTS)
    mix.record(json.dumps({"temperature": 0.7}).encode())
    mix.replied(False, 10, 4)
    shown = by_sampling({}, "draft-mtp n3", mix.status(), sampled_at(mix.status()))
    assert [figures(r) for r in shown] == [(True, "t0.7", None, 0.4)]
    assert shown[0].text() == "sampled (t0.7) 40% accepted"
    spec = SpecStatus("draft-mtp", True, "planned", 0.4, 1.2, by_sampling=shown)
    assert SpecStatus.from_json(json.loads(json.dumps(spec.to_json()))) == spec


KV_KEY = "m.gguf:1:ab | - | build | card | 65536"


@pytest.mark.asyncio
async def test_long_context_modes_probe_at_the_mix_sampling_and_store_it_apart(tmp_path):
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path)})
    trials = kvmodes.trials_for(("q8_0",))
    greedy = KvModes(KV_KEY)
    for trial in trials:
        greedy = greedy.with_refused(trial.label, "measured greedy")
    kvmodes.write_modes(paths, greedy)
    modes = KvModesPlan(KV_KEY, trials, "exact q8_0", 1024)
    setup = KvSetup(modes, ProbePace(0.0), lambda trial: "cannot", lambda: None)
    measuring = KvModeCalibrator(paths, setup)
    assert state(measuring) == "done"  # greedy: every mode is stored
    mix = SamplingMix(DEFAULTS)
    measuring.mix = mix
    # Served at the defaults' temperature: the modes there are unmeasured, so due once idle.
    measuring.observe([ServedRequest(100, 8, 0.1)])
    sampled_key = f"{KV_KEY} | t0.6"
    assert measuring.measurement.key == sampled_key and state(measuring) == "waiting"
    body = await probe_body(measuring, Run(mix))
    assert (body["temperature"], body["top_k"], body["seed"]) == (0.6, 20, PROBE_SEED)
    measuring._keep(measuring.measurement.with_refused("exact q8_0", "measured at t0.6"))
    stored = kvmodes.read_modes(paths, sampled_key)
    assert stored is not None and stored.refused == (("exact q8_0", "measured at t0.6"),)
    assert kvmodes.read_modes(paths, KV_KEY) == greedy  # the greedy entry as it was
    # Greedy requests again: the greedy modes are read back, nothing is due.
    for _ in range(3):
        mix.record(json.dumps({"temperature": 0}).encode())
    measuring.state = "done"
    measuring.observe([ServedRequest(100, 8, 0.1)])
    assert measuring.measurement == greedy and state(measuring) == "done"
    assert kvmodes.at_sampling(sampled_key, "greedy") == KV_KEY
