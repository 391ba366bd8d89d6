"""Replay with an event between turns: each turn's TTFT after a restart, against the same turn
warm and cold.

Three passes over the transcript's calls, on one server that the bench owns:

- warm: the calls in order, nothing between them (each reads only what its predecessor left);
- after: the calls in order again, the server restarted (or swapped to another model and back,
  or restarted to calibrate its speculation once idle and serve what it chose) before every call
  but the first (each stop saves the engine's slot, each start of the same model restores it),
  so a call reads what survived;
- cold: per call, an unrelated prompt of the same size, which no cache holds.

The measurement (:func:`replay_between`) takes the event as a callable, so the I/O of stopping
and starting stays with the caller; the report (:class:`BetweenTurn`) is pure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lucebox.engine.bench.compare import Served
from lucebox.engine.bench.measure import CallSample, count_prompt_tokens, streamed_call
from lucebox.engine.bench.replay import WARM_UP, request_base
from lucebox.engine.bench.transcript import Transcript
from lucebox.engine.core.errors import UsageError

EVENT_FORMS = "restart | calibrate | swap:MODEL"


@dataclass(frozen=True)
class BetweenEvent:
    """What happens before each call: a restart, a calibration (a restart whose speculation
    is measured once idle, as a first serve of a model measures it), or a swap to ``model``
    and back."""

    kind: str
    model: str | None = None


def parse_between(text: str) -> BetweenEvent:
    if text in ("restart", "calibrate"):
        return BetweenEvent(text)
    kind, _, model = text.partition(":")
    if kind == "swap" and model:
        return BetweenEvent("swap", model)
    raise UsageError(
        f"--between {text}: not an event",
        hint=f"--between {EVENT_FORMS}",
    )


def read_tokens(sample: CallSample) -> int | None:
    """Prompt tokens the engine computed, not served from a cache."""
    if sample.prompt_tokens is None:
        return None
    return sample.prompt_tokens - (sample.cached_tokens or 0)


@dataclass(frozen=True)
class BetweenTurn:
    """One call measured three ways."""

    index: int
    event: str
    after: CallSample
    """The call sent right after the event."""
    warm: CallSample
    """The same call with nothing between it and the call before."""
    cold: CallSample
    """An unrelated prompt of the same size."""

    @property
    def kept_share(self) -> float | None:
        """Of the prompt the warm call did not have to read, the share the event kept."""
        after, warm, whole = (
            read_tokens(self.after),
            read_tokens(self.warm),
            self.after.prompt_tokens,
        )
        if after is None or warm is None or not whole or whole <= warm:
            return None
        return max(0.0, min(1.0, (whole - after) / (whole - warm)))

    def to_json(self) -> dict[str, Any]:
        def side(sample: CallSample) -> dict[str, Any]:
            return {
                "ttft_s": round(sample.ttft_s, 3),
                "prompt_tokens": sample.prompt_tokens,
                "cached_tokens": sample.cached_tokens,
            }

        kept = self.kept_share
        return {
            "index": self.index,
            "event": self.event,
            "after": side(self.after),
            "warm": side(self.warm),
            "cold": side(self.cold),
            "kept_share": None if kept is None else round(kept, 3),
        }


def filler_messages(index: int, words: int) -> list[dict[str, str]]:
    """A user message of about ``words`` words that shares no text with any transcript or with
    the filler of another index."""
    text = " ".join(f"item{index}x{n}" for n in range(words))
    return [{"role": "user", "content": f"Inventory {index}, ignore it: {text}"}]


def _cold_call(served: Served, base: dict[str, Any], index: int, tokens: int) -> CallSample:
    """An unrelated prompt scaled to ``tokens`` from a measured probe of the filler."""
    headers = served.headers()
    probe_words = 64
    probe = {**base, "messages": filler_messages(index, probe_words)}
    per_word = count_prompt_tokens(served.url, probe, headers) / probe_words
    words = max(1, round(tokens / max(per_word, 0.1)))
    return streamed_call(served.url, {**base, "messages": filler_messages(index, words)}, headers)


def _turn(served: Served, base: dict[str, Any], transcript: Transcript, index: int) -> CallSample:
    body = {**base, "messages": transcript.prompt_of(index)}
    return streamed_call(served.url, body, served.headers())


def replay_between(
    served: Served,
    transcript: Transcript,
    event: Callable[[], Served],
    *,
    event_name: str = "restart",
    n_gen: int = 64,
    calls: int | None = None,
    on_turn: Callable[[BetweenTurn], None] = lambda turn: None,
) -> tuple[BetweenTurn, ...]:
    """Measure every call after the first with ``event`` (which returns the server to talk to
    next) before it, against the same call warm and cold."""
    indexes = list(range(len(transcript.call_starts)))[:calls]
    base = request_base(served, n_gen)
    streamed_call(served.url, {**base, "messages": WARM_UP, "max_tokens": 1}, served.headers())
    warm = [_turn(served, base, transcript, index) for index in indexes]
    after: list[CallSample] = [_turn(served, base, transcript, indexes[0])]
    for index in indexes[1:]:
        served = event()
        after.append(_turn(served, base, transcript, index))
    turns: list[BetweenTurn] = []
    for position, index in enumerate(indexes[1:], start=1):
        size = warm[position].prompt_tokens or 0
        cold = _cold_call(served, base, index, size)
        turn = BetweenTurn(index, event_name, after[position], warm[position], cold)
        turns.append(turn)
        on_turn(turn)
    return tuple(turns)
