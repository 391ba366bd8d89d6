"""The report of a replay with an event between turns: what each call read again, and how much
of what the warm call had cached the event kept."""

from __future__ import annotations

import pytest

from lucebox.engine.bench.between import (
    EVENT_FORMS,
    BetweenEvent,
    BetweenTurn,
    filler_messages,
    parse_between,
    read_tokens,
)
from lucebox.engine.bench.measure import CallSample
from lucebox.engine.core.errors import UsageError


def sample(ttft_s: float, prompt: int | None, cached: int | None) -> CallSample:
    return CallSample(
        ttft_s=ttft_s, decode_tok_s=None, prefill_tok_s=None, prompt_tokens=prompt,
        cached_tokens=cached, completion_tokens=4, draft_tokens=None, accepted_tokens=None,
        text="x", tool_calls=0, wall_s=1.0,
    )  # fmt: skip


def turn(after: CallSample, warm: CallSample) -> BetweenTurn:
    return BetweenTurn(2, "restart", after, warm, sample(0.9, 1000, 3))


@pytest.mark.parametrize(
    "after, warm, kept",
    [
        (sample(0.1, 1000, 900), sample(0.1, 1000, 900), 1.0),  # the slot came back whole
        (sample(0.5, 1000, 0), sample(0.1, 1000, 900), 0.0),  # nothing survived
        (sample(0.3, 1000, 450), sample(0.1, 1000, 900), 0.5),
        (sample(0.1, 1000, 950), sample(0.1, 1000, 900), 1.0),  # more than warm: capped
        (sample(0.1, None, None), sample(0.1, 1000, 900), None),  # the engine said no counts
        (sample(0.1, 1000, 0), sample(0.1, 1000, 0), None),  # warm cached nothing to keep
    ],
)
def test_the_kept_share_compares_what_the_event_left_with_what_warm_had(after, warm, kept):
    assert turn(after, warm).kept_share == kept


def test_read_tokens_are_the_prompt_less_the_cached_part():
    assert read_tokens(sample(0.1, 1000, 900)) == 100
    assert read_tokens(sample(0.1, 1000, None)) == 1000
    assert read_tokens(sample(0.1, None, None)) is None


def test_the_json_report_carries_all_three_sides():
    document = turn(sample(0.12345, 1000, 900), sample(0.1, 1000, 950)).to_json()
    assert document == {
        "index": 2,
        "event": "restart",
        "after": {"ttft_s": 0.123, "prompt_tokens": 1000, "cached_tokens": 900},
        "warm": {"ttft_s": 0.1, "prompt_tokens": 1000, "cached_tokens": 950},
        "cold": {"ttft_s": 0.9, "prompt_tokens": 1000, "cached_tokens": 3},
        "kept_share": 0.947,  # 900 of the 950 warm had
    }


def test_fillers_share_nothing_but_their_opening():
    first, second = filler_messages(1, 50), filler_messages(2, 50)
    assert len(first[0]["content"].split()) > 50
    assert set(first[0]["content"].split()[4:]).isdisjoint(second[0]["content"].split())


def test_an_event_is_a_restart_or_a_swap_to_a_named_model():
    assert parse_between("restart") == BetweenEvent("restart")
    assert parse_between("swap:qwen3.6:27b") == BetweenEvent("swap", "qwen3.6:27b")
    for text in ("swap", "swap:", "sleep", "restart:x"):
        with pytest.raises(UsageError, match="not an event"):
            parse_between(text)


def test_calibrate_is_an_event_the_forms_name():
    assert parse_between("calibrate") == BetweenEvent("calibrate")
    assert "calibrate" in EVENT_FORMS.split(" | ")
    for text in ("calibrate:x", "calibration"):
        with pytest.raises(UsageError, match="not an event") as caught:
            parse_between(text)
        assert caught.value.hint == "--between restart | calibrate | swap:MODEL"
