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


def test_draft_acceptance_is_kept_apart_for_greedy_and_sampled_replies():
    from lucebox.engine.run.front.frontwire import ReplyTokens

    mix = SamplingMix(SAMPLED)
    # llama-server's timings, as a whole reply and as a stream's last event carry them.
    greedy_reply = b'{"timings":{"predicted_n":64,"draft_n":60,"draft_n_accepted":54}}'
    sampled_event = b'data: {"choices":[],"timings":{"draft_n":40,"draft_n_accepted":18}}\n\n'
    for sent, seen in ((body(temperature=0), greedy_reply), (body(), sampled_event)):
        reply = ReplyTokens()
        reply.greedy = mix.record(sent)
        reply.see(seen)
        mix.replied(reply.greedy, reply.drafted, reply.accepted)
    plain = ReplyTokens()  # a reply the engine did not draft for says nothing of acceptance
    plain.see(b'{"timings":{"predicted_n":9}}')
    mix.replied(True, plain.drafted, plain.accepted)
    mix.replied(None, 10, 10)  # not a generation request
    status = mix.status()
    assert (status.greedy_acceptance, status.sampled_acceptance) == (0.9, 0.45)
    assert status.text().endswith("drafts accepted 90% greedy, 45% sampled")
    assert SamplingStatus.from_json(status.to_json()) == status
