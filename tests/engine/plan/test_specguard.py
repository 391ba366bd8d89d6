"""The speculation guard's decisions (pure): enough drafts first, one direction, no flapping."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lucebox.engine.plan.speculation.specguard import (
    MIN_DECODED_TOKENS,
    MIN_DRAFTED_TOKENS,
    SpecGuard,
    acceptance_floor,
    describe,
)
from lucebox.engine.plan.speculation.workload import RateCurve, ServedRequest
from lucebox.engine.run.kinds.luceboxrun import LuceboxLog
from support.luceboxfake import FIXTURES


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
        ("draft-mtp", 3, False, 1.0, "break-even measured for draft-mtp on a CPU"),
        ("draft-dflash", 15, False, 0.65, "the 65% break-even measured for draft-dflash on a CPU"),
        ("ngram-mod", None, False, 0.6, "measured for ngram-mod on a CPU"),
        (
            "draft-simple",
            8,
            False,
            0.9,
            "draft-simple with 8-token drafts was not measured on a CPU",
        ),
        ("draft-mtp", 3, True, 0.6, "the 60% break-even measured for draft-mtp on CUDA"),
        ("draft-dflash", 15, True, 0.16, "measured for draft-dflash on CUDA"),
        ("ngram-mod", None, True, 0.46, "measured for ngram-mod on CUDA"),
        ("ngram-simple", None, True, 0.46, "measured for ngram-mod on CUDA"),
        ("draft-mtp", 2, True, 0.7, "draft-mtp with 2-token drafts was not measured on CUDA"),
    ],
)
def test_floors_name_where_they_come_from(spec_type, draft_max, on_gpu, floor, says):
    value, source = acceptance_floor(spec_type, draft_max, on_gpu)
    assert value == floor and says in source


def test_shorter_drafts_are_judged_against_their_own_break_even():
    guard = SpecGuard.for_launch("draft-mtp", 6, on_gpu=True)
    assert guard.floor == 0.43
    guard, decision = guard.judge(1000, 300)  # 30%: below 6-token drafts' 43%
    assert decision is not None and decision.action == "shorten" and decision.draft_max == 3
    assert guard.floor == 0.6 and "60%" in guard.floor_source
    guard, decision = guard.judge(1600, 300 + 330)  # 55% of 3-token drafts: within hysteresis
    assert decision is None


def test_a_launch_already_shortened_goes_straight_to_off():
    guard = SpecGuard.for_launch("draft-dflash", 7, on_gpu=False, shortened=True)
    _, decision = guard.judge(300, 0)
    assert decision is not None and decision.action == "off"


@pytest.mark.parametrize(
    ("spec_type", "draft_max", "user_chose", "shortened", "says"),
    [
        ("draft-mtp", 3, False, False, "the guard shortens the drafts, then stops speculating,"),
        ("draft-mtp", 3, False, True, "the guard stops speculating below"),
        ("ngram-mod", None, False, False, "the guard stops speculating below the 46%"),
        ("draft-dflash", 15, True, False, "the guard warns below"),
    ],
)
def test_the_plan_says_what_the_guard_will_do(spec_type, draft_max, user_chose, shortened, says):
    text = describe(spec_type, draft_max, True, user_chose=user_chose, shortened=shortened)
    assert says in text


# Throughput: the H100 figures of issue 30 (no-spec 680 tok/s; a head that never passes p-min
# 0.75 drafts nothing and decodes at 440). Each served request is one reply of ``tokens``
# decode steps at ``tok_s``.

FLAT = RateCurve((), 680.0)
"""A measurement stored before probes kept their prompt lengths: one rate for every request."""


def served(tokens: int, tok_s: float, prompt_tokens: int = 77) -> list[ServedRequest]:
    return [ServedRequest(prompt_tokens, tokens + 1, tokens / tok_s)]


def test_a_model_draft_that_drafts_nothing_is_switched_off_after_a_bounded_decode():
    guard = SpecGuard.for_launch("draft-mtp", 3, on_gpu=True, baseline=FLAT)
    guard, early = guard.judge_rate(served(MIN_DECODED_TOKENS - 1, 440), 0)
    assert early is None
    guard, decision = guard.judge_rate(served(1024 - MIN_DECODED_TOKENS + 1, 440), 0)
    assert decision is not None and decision.action == "off"
    assert decision.reason == (
        "drafted nothing in 1024 decoded tokens, 0.65x of none; speculation switched off"
    )


def test_drafting_nothing_is_caught_without_a_measurement_too():
    guard = SpecGuard.for_launch("draft-mtp", 3, on_gpu=True)
    _, decision = guard.judge_rate(served(600, 600), 0)
    assert decision is not None and decision.reason.startswith("drafted nothing in 600")


def test_ngram_that_finds_no_match_costs_nothing_and_is_kept():
    guard = SpecGuard.for_launch("ngram-mod", None, on_gpu=True, baseline=FLAT)
    _, decision = guard.judge_rate(served(2048, 500), 0)
    assert decision is None


def test_a_model_draft_below_the_measured_rate_is_shortened_then_switched_off():
    guard = SpecGuard.for_launch("draft-dflash", 15, on_gpu=True, baseline=FLAT)
    guard, first = guard.judge_rate(served(1024, 400), 900)
    assert first is not None and first.action == "shorten" and first.draft_max == 7
    assert "decoding at 400 tok/s, 0.59x of the 680 tok/s measured without speculation" in (
        first.reason
    )
    guard, restarted = guard.judge_rate(served(10, 100), 5)  # the shortened engine's counters
    assert restarted is None
    guard, second = guard.judge_rate(served(1024, 450), 700)
    assert second is not None and second.action == "off"


def test_near_the_measured_rate_nothing_changes_and_measured_launches_skip_the_floors():
    guard = SpecGuard.for_launch("draft-mtp", 3, on_gpu=True, baseline=FLAT)
    _, decision = guard.judge_rate(served(1024, 600), 900)  # 0.88x: within the margin
    assert decision is None
    # 10% accepted is far below the 60% CUDA floor, yet the measured rate decides.
    _, by_acceptance = guard.judge(1000, 100)
    assert by_acceptance is None


# Similar requests: decode without speculation slows with the prompt's length. Recorded on the
# H100 with the tests' 16-wide attention heads (their attention ran on the CPU): 415 tok/s
# after a 77-token prompt, 50 after 1,251 (commit 3d7863d).

BY_LENGTH = RateCurve(((77, 415.0), (1251, 50.0)), 232.5)


def test_the_rate_without_speculation_is_read_at_the_prompt_length_clamped_to_the_probes():
    assert BY_LENGTH.tok_s_at(77) == 415.0
    assert BY_LENGTH.tok_s_at(664) == pytest.approx(232.5)  # halfway
    assert BY_LENGTH.tok_s_at(10) == 415.0 and BY_LENGTH.tok_s_at(20_000) == 50.0
    assert FLAT.tok_s_at(5000) == 680.0


def test_long_agent_turns_are_judged_against_the_long_probe_not_the_short_chat():
    # Speculation decodes long turns at 60 tok/s: 1.2x of none at that length, though far below
    # the short chat's 415 (0.14x) and the probes' overall rate.
    guard = SpecGuard.for_launch("draft-mtp", 3, on_gpu=True, baseline=BY_LENGTH)
    turns = [r for _ in range(4) for r in served(256, 60, prompt_tokens=1251)]
    _, decision = guard.judge_rate(turns, 900)
    assert decision is None
    # The same mode at 30 tok/s on those turns is 0.6x of none there: its drafts are shortened.
    slow = [r for _ in range(4) for r in served(256, 30, prompt_tokens=1251)]
    _, decision = guard.judge_rate(slow, 900)
    assert decision is not None and decision.action == "shorten"
    assert "0.60x of the 50 tok/s measured without speculation for prompts of these" in (
        decision.reason
    )


def test_a_mixed_window_weighs_each_request_by_its_decoded_tokens_at_its_own_length():
    # 256 tokens after a short prompt at 415 (1.0x there) and 256 after a long one at 40 (0.8x):
    # none would take 256/415 + 256/50 s, speculation took 256/415 + 256/40 s.
    guard = SpecGuard.for_launch("draft-dflash", 15, on_gpu=True, baseline=BY_LENGTH)
    mixed = [*served(256, 415), *served(256, 40, prompt_tokens=1251)]
    _, decision = guard.judge_rate(mixed, 900)
    none_s, spec_s = 256 / 415 + 256 / 50, 256 / 415 + 256 / 40
    assert decision is not None and f"{none_s / spec_s:.2f}x of the" in decision.reason


DONE = (
    "[server] chat DONE chatcmpl_0000000000000001 ok=true in=64 effective_in=64 out=256 0.3s "
    "755.9 tok/s finish=stop restore=false slot=-1 prefix_len=0 prefill=0.0s "
    "decode=0.3s(781.2tok/s) error=- detail=-"
)
"""A reply's closing line, as the engine writes one after each decode line: the totals count a
reply once it finished (lucebox's own replies are left out then)."""


def _lucebox_totals(*decode_lines: str) -> tuple[int, int]:
    """The engine's running drafted and accepted totals after ``decode_lines``, read by the
    parser the server runs."""
    log = LuceboxLog()
    for line in decode_lines:
        log.feed(line)
        if line.startswith(("[spec-decode]", "[ar-decode]")):
            log.feed(DONE)
    return log.drafted_total, log.accepted_total


def _spec_line(steps: int, accepted: int, commit: int) -> str:
    """A ``[spec-decode]`` line in the engine's format: it divides by 16 positions a step."""
    return (
        f"[spec-decode] tokens={steps * commit} time=1.000 s speed={steps * commit}.00 tok/s "
        f"steps={steps} accepted={accepted}/{steps * 16} ({100 * accepted / steps / 16:.1f}%) "
        f"avg_commit={commit}.00"
    )


def test_ddtree_committing_five_tokens_a_step_keeps_speculating():
    """A real pair commits 5-8 tokens a step: 25-45% of the positions the engine divides by,
    far below any per-drafted-token break-even, and several times plain decoding."""
    guard = SpecGuard.for_launch("ddtree", None, on_gpu=True)
    drafted, accepted = _lucebox_totals(*[_spec_line(40, 4 * 40, 5)] * 3)
    assert accepted / drafted == 0.25
    _, decision = guard.judge(drafted, accepted)
    assert decision is None


def test_ddtree_that_accepts_nothing_is_switched_off():
    """The H100's random-weight draft: nothing accepted, 0.37x of plain decoding."""
    recorded = (FIXTURES / "ddtree-spec.log").read_text().splitlines()
    drafted, accepted = _lucebox_totals(*recorded)
    assert drafted >= MIN_DRAFTED_TOKENS and accepted == 0
    _, decision = SpecGuard.for_launch("ddtree", None, on_gpu=True).judge(drafted, accepted)
    assert decision is not None and decision.action == "off"
    assert "verified positions" in decision.reason


def test_replies_decoded_without_the_draft_do_not_read_as_drafting_nothing():
    """A chat app's sampled requests on a Lucebox family without sampled verification decode
    without DDTree (the H100's ddtree-spec.log): 600 such tokens drafted nothing, and say
    nothing about the draft the greedy requests use."""
    recorded = (FIXTURES / "ddtree-spec.log").read_text().splitlines()
    log = LuceboxLog()
    for line in recorded:
        log.feed(line)
    sampled = [r.served() for r in log.take_finished() if not r.served().speculated]
    assert sampled and sum(r.decode_steps for r in sampled) < MIN_DECODED_TOKENS
    guard = SpecGuard.for_launch("ddtree", None, on_gpu=True)
    _, decision = guard.judge_rate(sampled * 3, 0)
    assert decision is None
    # The same tokens decoded with the draft, drafting nothing, switch it off.
    drafting = [replace(r, speculated=True) for r in sampled * 3]
    _, decision = guard.judge_rate(drafting, 0)
    assert decision is not None and decision.reason.startswith("drafted nothing")


def test_ddtree_committing_under_two_tokens_a_step_is_switched_off():
    """The hysteresis of a small floor is a quarter of it, not the fixed 0.05 that would put
    the Lucebox floor's act point at 1.2 tokens a step."""
    guard = SpecGuard.for_launch("ddtree", None, on_gpu=True)
    drafted, accepted = _lucebox_totals(*[_spec_line(50, 25, 2)] * 2)  # 3% of positions
    _, decision = guard.judge(drafted, accepted)
    assert decision is not None and decision.action == "off"
    near, near_accepted = _lucebox_totals(*[_spec_line(50, 45, 2)] * 2)  # 5.6%: near the floor
    _, kept = SpecGuard.for_launch("ddtree", None, on_gpu=True).judge(near, near_accepted)
    assert kept is None
