"""The speculation guard's decisions (pure): enough drafts first, one direction, no flapping."""

from __future__ import annotations

import pytest

from lucebox.engine.specguard import (
    MIN_DRAFTED_TOKENS,
    SpecGuard,
    acceptance_floor,
)


def test_nothing_is_decided_before_enough_drafted_tokens():
    guard = SpecGuard.for_launch("draft-mtp", 3, on_gpu=False)
    guard, decision = guard.judge(MIN_DRAFTED_TOKENS - 1, 0)
    assert decision is None


def test_a_draft_that_is_never_accepted_is_shortened_then_switched_off():
    guard = SpecGuard.for_launch("draft-mtp", 6, on_gpu=False)
    guard, first = guard.judge(300, 3)
    assert first is not None and first.action == "shorten" and first.draft_max == 3
    assert "1% of 300 drafted tokens accepted" in first.reason
    guard, waiting = guard.judge(400, 4)  # 100 more drafted: not enough to judge again
    assert waiting is None
    guard, second = guard.judge(600, 6)
    assert second is not None and second.action == "off"
    assert "switched off" in second.reason


def test_acceptance_above_the_floor_keeps_speculating_and_slides_the_window():
    guard = SpecGuard.for_launch("draft-dflash", 15, on_gpu=False)
    guard, decision = guard.judge(1000, 900)
    assert decision is None and guard.drafted_at_start == 1000
    # a later bad stretch is judged on its own, not averaged with the good one
    guard, decision = guard.judge(1400, 910)
    assert decision is not None and decision.action == "shorten"


def test_near_the_floor_nothing_changes():
    floor, _ = acceptance_floor("draft-dflash", 15, on_gpu=False)
    guard = SpecGuard.for_launch("draft-dflash", 15, on_gpu=False)
    _, decision = guard.judge(1000, int(1000 * (floor - 0.04)))
    assert decision is None


def test_a_new_engine_process_restarts_the_count():
    guard = SpecGuard.for_launch("ngram-mod", None, on_gpu=False)
    guard, _ = guard.judge(2000, 1900)
    guard, decision = guard.judge(10, 0)
    assert decision is None and guard.drafted_at_start == 0


@pytest.mark.parametrize(
    ("spec_type", "draft_max", "on_gpu", "floor", "says"),
    [
        ("draft-mtp", 3, False, 1.0, "measured CPU break-even"),
        ("draft-dflash", 15, False, 0.85, "measured CPU break-even"),
        ("ngram-mod", None, False, 0.55, "measured CPU break-even"),
        ("draft-simple", 8, False, 0.9, "not measured on CPU"),
        ("draft-mtp", 3, True, 0.6, "measured CUDA break-even of draft-mtp"),
        ("draft-dflash", 15, True, 0.16, "measured CUDA break-even"),
        ("ngram-mod", None, True, 0.46, "measured CUDA break-even of ngram-mod"),
        ("draft-mtp", 2, True, 0.7, "not measured on CUDA"),
    ],
)
def test_floors_name_where_they_come_from(spec_type, draft_max, on_gpu, floor, says):
    value, source = acceptance_floor(spec_type, draft_max, on_gpu)
    assert value == floor and says in source
