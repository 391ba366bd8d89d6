"""One streamed chat call, measured: time to first token, decode and prefill rates, cached
prompt tokens and speculative acceptance, from the engine's ``timings`` and ``usage``.

Each call streams through the one API client (``core.api``), on a connection of its own.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx

from lucebox.engine.core.api import CallError, stream_chat_chunks


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
    url: str, body: dict[str, Any], headers: dict[str, str], timeout_s: float = 600
) -> CallSample:
    """POST ``body`` to ``/v1/chat/completions`` as a stream and measure the reply."""
    return asyncio.run(_streamed_call(url, body, headers, timeout_s))


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
    )


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None
