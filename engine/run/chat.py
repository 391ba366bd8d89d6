"""A streamed chat completion against the served model, timed the way a user feels it."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class ChatDelta:
    """A piece of the reply; the last one has ``done`` and the reply's timings."""

    text: str
    ttft_s: float | None = None
    """Seconds from sending the request to the first piece of text."""
    tokens_per_s: float | None = None
    """The engine's decode rate for this reply (its own timings), on the last delta."""
    done: bool = False


class ChatError(Exception):
    """The server refused or broke off the request; the message says why."""


async def stream_chat(
    client: httpx.AsyncClient,
    url: str,
    messages: list[dict[str, str]],
    *,
    api_key: str | None = None,
    max_tokens: int = 512,
) -> AsyncIterator[ChatDelta]:
    """Stream ``messages``' reply from an OpenAI-compatible server at ``url``."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"messages": messages, "stream": True, "max_tokens": max_tokens}
    sent_at = time.monotonic()
    ttft_s: float | None = None
    tokens_per_s: float | None = None
    try:
        async with client.stream(
            "POST", f"{url}/v1/chat/completions", json=body, headers=headers
        ) as reply:
            if reply.status_code != 200:
                detail = (await reply.aread()).decode("utf-8", errors="replace")[:200]
                raise ChatError(f"the server answered {reply.status_code}: {detail}")
            async for line in reply.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line.removeprefix("data: "))
                timings = chunk.get("timings")
                if isinstance(timings, dict) and "predicted_per_second" in timings:
                    tokens_per_s = float(timings["predicted_per_second"])
                for choice in chunk.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        if ttft_s is None:
                            ttft_s = time.monotonic() - sent_at
                        yield ChatDelta(text, ttft_s)
    except httpx.HTTPError as exc:
        raise ChatError(f"the request to {url} failed: {exc}") from exc
    except ValueError as exc:
        raise ChatError(f"the server sent a reply that is not JSON: {exc}") from exc
    yield ChatDelta("", ttft_s, tokens_per_s, done=True)
