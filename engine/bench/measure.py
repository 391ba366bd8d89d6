"""One streamed chat call, measured: time to first token, decode and prefill rates, cached
prompt tokens and speculative acceptance, from the engine's ``timings`` and ``usage``.

Each call streams through the one API client (``core.api``), on a connection of its own.
Both engines stream. llama-server reports a reply in ``timings`` (rates, cached and drafted
tokens); the Lucebox engine ends its stream with a ``usage`` chunk whose ``timings`` hold
prefill and decode milliseconds but no acceptance (only its non-streamed reply has
``accept_rate``), so a Lucebox reply's drafted and accepted tokens come from its log's
``[spec-decode]`` line, read with the run's own parser when the engine's log is known.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from lucebox.engine.core.api import CallError, stream_chat_chunks
from lucebox.engine.run.kinds.luceboxrun import LuceboxLog, reply_from_usage

LOG_WAIT_S = 2.0
"""How long a reply's closing line may trail its last streamed chunk into the engine's log
(the supervisor copies the engine's output to the file as it comes)."""


@dataclass(frozen=True)
class CallSample:
    ttft_s: float
    """Seconds from sending to the first generated piece (text, reasoning or tool call); for a
    reply with none, to its end: what the user waited to learn there is nothing."""
    decode_tok_s: float | None
    prefill_tok_s: float | None
    prompt_tokens: int | None
    """All prompt tokens of the call, cached ones included."""
    cached_tokens: int | None
    completion_tokens: int
    draft_tokens: int | None
    accepted_tokens: int | None
    text: str
    tool_calls: int
    wall_s: float
    usage: dict[str, Any] = field(default_factory=dict, compare=False)
    """The reply's ``usage`` as the engine sent it (its shape tells which engine answered)."""

    @property
    def empty(self) -> bool:
        """No text and no tool call: the reply a user would see as nothing."""
        return not self.text.strip() and self.tool_calls == 0

    @property
    def acceptance(self) -> float | None:
        if not self.draft_tokens or self.accepted_tokens is None:
            return None
        return self.accepted_tokens / self.draft_tokens


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) else None


def count_prompt_tokens(
    url: str, body: dict[str, Any], headers: dict[str, str], timeout_s: float = 120
) -> int:
    """Tokens of the prompt that ``body`` renders to, as the server's template makes it."""
    with httpx.Client(timeout=timeout_s, headers=headers) as client:
        try:
            reply = client.post(f"{url}/v1/chat/completions/input_tokens", json=body)
        except httpx.HTTPError as exc:
            raise CallError(f"counting prompt tokens at {url} failed: {exc}") from exc
    if reply.status_code != 200:
        raise CallError(f"counting prompt tokens: the server answered {reply.status_code}")
    return int(reply.json()["input_tokens"])


def served_context(url: str, headers: dict[str, str], timeout_s: float = 30) -> int:
    """The context (tokens) one request may fill, from ``/props``."""
    with httpx.Client(timeout=timeout_s, headers=headers) as client:
        try:
            props = client.get(f"{url}/props").json()
        except (httpx.HTTPError, ValueError) as exc:
            raise CallError(f"reading {url}/props failed: {exc}") from exc
    return int(props["default_generation_settings"]["n_ctx"])


def streamed_call(
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    timeout_s: float = 600,
    engine_log: Path | None = None,
) -> CallSample:
    """POST ``body`` to ``/v1/chat/completions`` as a stream and measure the reply;
    ``engine_log`` is the serving engine's log (the Lucebox engine's acceptance is there)."""
    offset = engine_log.stat().st_size if engine_log is not None and engine_log.exists() else 0
    sample = asyncio.run(_streamed_call(url, body, headers, timeout_s))
    if engine_log is None or not is_lucebox_usage(sample.usage):
        return sample
    return with_lucebox_log(sample, _reply_lines(engine_log, offset))


def is_lucebox_usage(usage: dict[str, Any]) -> bool:
    """The Lucebox engine's reply usage: its ``timings`` are in milliseconds per phase."""
    timings = usage.get("timings")
    return isinstance(timings, dict) and "decode_ms" in timings


def _reply_lines(log: Path, offset: int) -> list[str]:
    """The engine's lines written since ``offset``, once its closing line for the reply is in."""
    deadline = time.monotonic() + LOG_WAIT_S
    while True:
        with log.open("rb") as handle:
            handle.seek(offset)
            lines = handle.read().decode("utf-8", errors="replace").splitlines()
        if any("chat DONE" in line for line in lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def with_lucebox_log(sample: CallSample, lines: list[str]) -> CallSample:
    """``sample`` with the drafted and accepted tokens of the engine's log lines for it; a
    reply decoded without speculation (an ``[ar-decode]`` line) drafted nothing."""
    log = LuceboxLog()
    for line in lines:
        log.feed(line)
    replies = log.take_finished()
    if not replies:
        return sample
    reply = replies[-1]
    return replace(sample, draft_tokens=reply.draft_generated, accepted_tokens=reply.draft_accepted)


async def _streamed_call(
    url: str, body: dict[str, Any], headers: dict[str, str], timeout_s: float
) -> CallSample:
    request = {**body, "stream_options": {"include_usage": True}}
    texts: list[str] = []
    tool_call_ids: set[int] = set()
    timings: dict[str, Any] = {}
    usage: dict[str, Any] = {}
    pieces = 0
    first_at = last_at = None
    sent_at = time.monotonic()
    async for at_s, chunk in stream_chat_chunks(url, request, headers, timeout_s):
        timings = chunk.get("timings") or timings
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            calls = delta.get("tool_calls") or []
            if delta.get("content") or delta.get("reasoning_content") or calls:
                last_at = at_s
                first_at = first_at or last_at
                pieces += 1
            texts.append(delta.get("content") or "")
            tool_call_ids.update(int(call.get("index", 0)) for call in calls)
    done_at = time.monotonic()
    if is_lucebox_usage(usage):
        return _lucebox_sample(usage, texts, tool_call_ids, first_at or done_at, sent_at, done_at)
    decode = timings.get("predicted_per_second")
    if decode is None and first_at is not None and last_at is not None and last_at > first_at:
        decode = (pieces - 1) / (last_at - first_at)
    cached = _int(timings.get("cache_n"))
    if cached is None:
        cached = _int((usage.get("prompt_tokens_details") or {}).get("cached_tokens"))
    prompt_tokens = _int(usage.get("prompt_tokens"))
    if prompt_tokens is None and "prompt_n" in timings:
        prompt_tokens = int(timings["prompt_n"]) + (cached or 0)
    return CallSample(
        ttft_s=(first_at or done_at) - sent_at,
        decode_tok_s=None if decode is None else float(decode),
        prefill_tok_s=_float(timings.get("prompt_per_second")),
        prompt_tokens=prompt_tokens,
        cached_tokens=cached,
        completion_tokens=_int(usage.get("completion_tokens")) or pieces,
        draft_tokens=_int(timings.get("draft_n")),
        accepted_tokens=_int(timings.get("draft_n_accepted")),
        text="".join(texts),
        tool_calls=len(tool_call_ids),
        wall_s=done_at - sent_at,
        usage=usage,
    )


def _lucebox_sample(
    usage: dict[str, Any],
    texts: list[str],
    tool_call_ids: set[int],
    first_at: float,
    sent_at: float,
    done_at: float,
) -> CallSample:
    """A Lucebox reply's figures from its usage, read by the run's parser (prefill and decode
    rates over the engine's own phase times; no cached tokens or acceptance there)."""
    prompt, completion, prefill_s, decode_s, _ = reply_from_usage(usage)
    return CallSample(
        ttft_s=first_at - sent_at,
        decode_tok_s=completion / decode_s if decode_s > 0 else None,
        prefill_tok_s=prompt / prefill_s if prefill_s > 0 else None,
        prompt_tokens=prompt,
        cached_tokens=None,
        completion_tokens=completion,
        draft_tokens=None,
        accepted_tokens=None,
        text="".join(texts),
        tool_calls=len(tool_call_ids),
        wall_s=done_at - sent_at,
        usage=usage,
    )


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None
