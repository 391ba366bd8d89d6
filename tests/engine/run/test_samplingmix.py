"""The front's tally of the sampling its requests got, and the probe fields it gives."""

from __future__ import annotations

import json

from lucebox.engine.plan.samplingdefaults import SamplingDefaults
from lucebox.engine.run.front.samplingmix import PROBE_SEED, SamplingMix, probe_fields
from lucebox.engine.run.runstate import Status
from lucebox.engine.run.sample import SamplingStatus

SAMPLED = SamplingDefaults(0.6, 0.95, 20, 0.0, "preset")
GREEDY = SamplingDefaults(0.0, 0.95, 20, 0.0, "preset")


def body(**fields: object) -> bytes:
    return json.dumps({"messages": [], **fields}).encode()


def test_before_any_request_the_defaults_stand_in():
    assert SamplingMix(SAMPLED).status() == SamplingStatus(0, 0, 0.6, "defaults")
    assert SamplingMix(GREEDY).status() == SamplingStatus(0, 0, 0.0, "defaults")
    assert SamplingMix(GREEDY).status().is_greedy and not SamplingMix(SAMPLED).status().is_greedy


def test_requests_count_by_class_unset_fields_as_the_defaults():
    mix = SamplingMix(SAMPLED)
    for sent in (body(), body(temperature=0.7), body(temperature=0.7), body(top_k=1), b"[]"):
        mix.record(sent)
    mix.record(body(temperature=0))
    found = mix.status()
    assert found == SamplingStatus(2, 3, 0.7, "clients")
    assert not found.is_greedy
    assert SamplingStatus.from_json(found.to_json()) == found
    assert found.to_json()["from"] == "clients"
    assert found.text() == "3 sampled (mostly at temperature 0.7), 2 greedy"
    assert SamplingMix(SAMPLED).status().text() == (
        "no request yet; the defaults stand in (temperature 0.6)"
    )
    restored = Status.from_file_json({"state": "ready", "sampling": found.to_json()})
    assert restored is not None and restored.sampling == found


def test_probes_carry_the_mix_sampling():
    greedy = SamplingStatus(5, 1, 0.7, "clients")
    assert probe_fields(greedy, SAMPLED) == {"temperature": 0, "seed": PROBE_SEED}
    assert probe_fields(None, SAMPLED) == {"temperature": 0, "seed": PROBE_SEED}
    sampled = SamplingStatus(1, 5, 0.7, "clients")
    assert probe_fields(sampled, SAMPLED) == {
        "temperature": 0.7,
        "top_p": 0.95,
        "top_k": 20,
        "min_p": 0.0,
        "seed": PROBE_SEED,
    }
