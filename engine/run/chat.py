"""A streamed chat completion against the served model, timed the way a user feels it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from lucebox.engine.core.api import auth_headers, stream_chat_chunks

CHAT_LIMITS = httpx.Timeout(300, connect=5)
"""A reply may be slow to start on a CPU; a server that does not answer at all fails fast."""


@dataclass(frozen=True)
class ChatDelta:
    """A piece of the reply; the last one has ``done`` and the reply's timings."""

    text: str
    ttft_s: float | None = None
    """Seconds from sending the request to the first piece of text."""
    tokens_per_s: float | None = None
    """The engine's decode rate for this reply (its own timings), on the last delta."""
    done: bool = False


async def stream_chat(
    url: str,
    messages: list[dict[str, Any]],
    *,
    api_key: str | None = None,
    max_tokens: int = 512,
) -> AsyncIterator[ChatDelta]:
    """Stream ``messages``' reply from an OpenAI-compatible server at ``url``.

    Raises:
        CallError: the server refused or broke off the request.
    """
    body = {"messages": messages, "max_tokens": max_tokens}
    sent_at = time.monotonic()
    ttft_s: float | None = None
    tokens_per_s: float | None = None
    async for at_s, chunk in stream_chat_chunks(url, body, auth_headers(api_key), CHAT_LIMITS):
        timings = chunk.get("timings")
        if isinstance(timings, dict) and "predicted_per_second" in timings:
            tokens_per_s = float(timings["predicted_per_second"])
        for choice in chunk.get("choices") or []:
            text = (choice.get("delta") or {}).get("content")
            if text:
                if ttft_s is None:
                    ttft_s = at_s - sent_at
                yield ChatDelta(text, ttft_s)
    yield ChatDelta("", ttft_s, tokens_per_s, done=True)
