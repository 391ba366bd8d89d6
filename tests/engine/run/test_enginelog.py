"""The engine's log read as it writes it: each request's timing lines, recorded from the real
engine, give what each reply's ``timings`` said."""

from __future__ import annotations

import pytest

from lucebox.engine.run.kinds.enginelog import EngineLog
from tests.engine.enginelog import engine_lines, http_seen


@pytest.mark.parametrize("name", ["spec", "two_slots", "reprocess"])
def test_each_request_is_read_as_the_engine_replied(name):
    log = EngineLog()
    for line in engine_lines(name):
        log.feed(line)
    finished = log.take_finished()
    timings = http_seen(name)["timings"]
    assert len(finished) == len(timings)
    for request, replied in zip(finished, timings, strict=True):
        assert request.prompt_tokens == replied["prompt_n"]
        assert request.generated_tokens == replied["predicted_n"]
        assert request.cached_tokens == replied["cache_n"]
        assert request.prompt_s == pytest.approx(replied["prompt_ms"] / 1000, abs=1e-5)
        assert request.decode_s == pytest.approx(replied["predicted_ms"] / 1000, abs=1e-5)
        assert request.draft_generated == replied.get("draft_n", 0)
        assert request.draft_accepted == replied.get("draft_n_accepted", 0)
        # As the guard and the served mix see it: the probes' prompt_n + cache_n.
        served = request.served()
        assert served.prompt_tokens == replied["prompt_n"] + replied["cache_n"]
        assert served.decode_steps == replied["predicted_n"] - 1
    assert log.take_finished() == []


def test_full_prompt_reprocessing_is_counted():
    log = EngineLog()
    for line in engine_lines("reprocess"):
        log.feed(line)
    reprocessed = [line for line in engine_lines("reprocess") if "forcing full prompt" in line]
    assert reprocessed and log.full_reprocess_events == len(reprocessed)
    assert http_seen("reprocess")["timings"][-1]["cache_n"] == 0
