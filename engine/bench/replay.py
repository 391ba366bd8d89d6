"""Replay an agent transcript against a server: every model call with exactly its prefix.

One warm-up call (one token, an unrelated prompt, so it primes nothing) comes first and is not
counted. Each call samples as the served requests did (`status`'s ``sampling``: greedy when
the mix is, else its typical temperature, with a fixed seed). A prefix that does not fit the
served context with room for the reply is skipped with a warning, never sent. The result is
the ``bench replay --json`` shape of docs/contracts.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lucebox.engine.bench.compare import Served
from lucebox.engine.bench.measure import (
    CallSample,
    count_prompt_tokens,
    served_context,
    streamed_call,
)
from lucebox.engine.bench.transcript import Transcript
from lucebox.engine.run.front.samplingmix import client_fields

WARM_UP = [{"role": "user", "content": "Reply with one word."}]


@dataclass(frozen=True)
class ReplayCall:
    index: int
    """The call's position in the transcript (0 = the first assistant turn)."""
    sample: CallSample

    def to_json(self) -> dict[str, Any]:
        sample = self.sample
        return {
            "index": self.index,
            "ttft_s": _round(sample.ttft_s),
            "decode_tok_s": _round(sample.decode_tok_s, 1),
            "prompt_tokens": sample.prompt_tokens,
            "cached_tokens": sample.cached_tokens,
            "empty": sample.empty,
        }


@dataclass(frozen=True)
class ReplayResult:
    calls: tuple[ReplayCall, ...]
    wall_s: float
    skipped: tuple[str, ...]

    @property
    def ttft_total_s(self) -> float:
        return sum(call.sample.ttft_s for call in self.calls)

    @property
    def warm_ttft_total_s(self) -> float:
        """TTFT of every call after the first, whose prefix an earlier call could have cached."""
        return sum(call.sample.ttft_s for call in self.calls[1:])

    @property
    def empty(self) -> int:
        return sum(call.sample.empty for call in self.calls)

    def to_json(self) -> dict[str, Any]:
        return {
            "calls": [call.to_json() for call in self.calls],
            "ttft_total_s": _round(self.ttft_total_s),
            "warm_ttft_total_s": _round(self.warm_ttft_total_s),
            "wall_s": _round(self.wall_s),
            "empty": self.empty,
            "skipped": list(self.skipped),
        }


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def request_base(served: Served, n_gen: int) -> dict[str, Any]:
    """The fields of every replayed call: the reply's length, the served sampling, the
    configuration's own fields."""
    extra = dict(served.config.request_fields)
    return {"max_tokens": n_gen, **client_fields(served.sampling), **extra}


def replay(
    served: Served,
    transcript: Transcript,
    *,
    n_gen: int = 64,
    calls: int | None = None,
    on_call: Callable[[ReplayCall], None] = lambda call: None,
    on_warning: Callable[[str], None] = lambda warning: None,
) -> ReplayResult:
    """Send each call of ``transcript`` (the first ``calls`` of them) in order and measure it."""
    headers = served.headers()
    base = request_base(served, n_gen)
    streamed_call(served.url, {**base, "messages": WARM_UP, "max_tokens": 1}, headers)
    n_ctx = served_context(served.url, headers)
    measured: list[ReplayCall] = []
    skipped: list[str] = []
    started = time.monotonic()
    for index in range(len(transcript.call_starts))[:calls]:
        body = {**base, "messages": transcript.prompt_of(index)}
        prompt_tokens = count_prompt_tokens(served.url, body, headers)
        if prompt_tokens + n_gen > n_ctx:
            warning = (
                f"call {index}: its prefix is {prompt_tokens} tokens, more than the served "
                f"context of {n_ctx} leaves room for with {n_gen} to generate; skipped"
            )
            skipped.append(warning)
            on_warning(warning)
            continue
        call = ReplayCall(index, streamed_call(served.url, body, headers))
        measured.append(call)
        on_call(call)
    return ReplayResult(tuple(measured), time.monotonic() - started, tuple(skipped))
