"""The hang rule: a busy engine with no progress past its phase's bound; idle never hangs."""

from __future__ import annotations

from lucebox.engine.run.hang import (
    DECODE_SILENCE_S,
    PREFILL_FLOOR_S,
    HangBounds,
    Look,
    Watch,
    bounds_for,
    chosen_look,
    hung,
    observe,
    silent_watch,
)

BOUNDS = HangBounds()


def test_decode_without_a_token_past_the_bound_is_a_hang_and_progress_resets_it():
    watch = observe(Watch(), Look(0.0, True, "decode", 40, (5,)), 0.0)
    watch = observe(watch, None, 30.0)  # the engine did not answer
    assert hung(watch, DECODE_SILENCE_S - 1, None, BOUNDS) is None
    assert "no token for 60 s" in (hung(watch, DECODE_SILENCE_S, None, BOUNDS) or "")
    watch = observe(watch, Look(59.0, True, "decode", 40, (6,)), 59.0)
    assert hung(watch, DECODE_SILENCE_S + 1, None, BOUNDS) is None


def test_an_idle_engine_never_hangs():
    watch = observe(Watch(), Look(0.0, True, "decode", 40, (5,)), 0.0)
    watch = observe(watch, Look(1.0, False), 1.0)
    assert hung(watch, 10_000.0, None, BOUNDS) is None


def test_the_prefill_bound_scales_with_the_prompt_at_the_measured_rate():
    long_prompt = observe(Watch(), Look(0.0, True, "prefill", 30_000, (0,)), 0.0)
    # 3x 30,000 tokens at 500 tok/s = 180 s; at the floor for a short prompt.
    assert hung(long_prompt, 179.0, 500.0, BOUNDS) is None
    assert hung(long_prompt, 180.0, 500.0, BOUNDS) is not None
    short = observe(Watch(), Look(0.0, True, "prefill", 10, (0,)), 0.0)
    assert hung(short, PREFILL_FLOOR_S - 1, 500.0, BOUNDS) is None
    assert "(10 tokens) made no progress" in (hung(short, PREFILL_FLOOR_S, 500.0, BOUNDS) or "")
    # No rate measured yet: a slow CPU's is assumed, so the bound errs long.
    assert hung(long_prompt, 180.0, None, BOUNDS) is None


def test_the_setting_sets_both_bounds_and_zero_never_judges():
    assert bounds_for(0) is None
    bounds = bounds_for(5)
    assert bounds is not None and bounds.decode_s == bounds.prefill_floor_s == 5
    watch = observe(Watch(), Look(0.0, True, "prefill", 10, (0,)), 0.0)
    assert hung(watch, 4.9, None, bounds) is None
    assert "made no progress for 5 s" in (hung(watch, 5.0, None, bounds) or "")


def test_an_engine_silent_from_the_first_look_gets_a_longer_bound_and_an_answer_resets_it():
    bounds = bounds_for(5)
    assert bounds is not None
    watch = silent_watch(0.0)
    assert hung(watch, 14.9, None, bounds) is None  # a long prompt batch answers no look
    assert "answered nothing for 15 s" in (hung(watch, 15.0, None, bounds) or "")
    watch = observe(watch, Look(10.0, True, "prefill", 4000, (100,)), 10.0)
    assert watch.phase == "prefill" and hung(watch, 15.0, None, bounds) is None


def test_the_fronts_view_starts_a_watch_or_carries_decode_but_never_cuts_a_prefill_short():
    """llama-server answers no look during a prompt batch: its prompt-sized prefill bound
    holds while the front only knows a request was sent; a stream's chunks count as decode."""
    long_prompt = Look(0.0, True, "prefill", 30_000, (1,))
    watch = observe(Watch(), long_prompt, 0.0)
    sent = Look(5.0, True, "silent", 0, (0,))
    for now_s in (5.0, 100.0, 400.0):
        watch = observe(watch, chosen_look(watch, None, sent), now_s)
    assert watch.phase == "prefill" and watch.since_s == 0.0
    assert hung(watch, 400.0, 20.0, BOUNDS) is None  # 3 x 30,000 / 20 = 4,500 s may pass
    # Nothing seen yet: the front's request starts the watch.
    assert chosen_look(Watch(), None, sent) is sent
    # Tokens flowing through the front are decode progress over any watch.
    flowing = Look(6.0, True, "decode", 0, (12,))
    assert chosen_look(watch, None, flowing) is flowing
    # The engine's own look always wins.
    assert chosen_look(watch, long_prompt, flowing) is long_prompt
