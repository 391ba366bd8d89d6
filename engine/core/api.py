"""The one client of the engine's OpenAI-style API: its Bearer header and its streamed replies.

A streamed reply is read on a connection of its own: llama-server closes the connection after a
streamed reply, and a reused keep-alive connection fails on the next request.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from lucebox.engine.core.errors import RunError


class CallError(RunError):
    """The server refused or broke off a call."""


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The headers a request to a server with ``api_key`` carries (none for a keyless server)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def stream_chat_chunks(
    url: str, body: dict[str, Any], headers: dict[str, str], limits: httpx.Timeout | float
) -> AsyncIterator[tuple[float, dict[str, Any]]]:
    """POST ``body`` to ``url``'s ``/v1/chat/completions`` as a stream.

    Yields each server-sent chunk with the monotonic time it arrived; ``limits`` are httpx's
    connect/read timeouts in seconds (a reply may take minutes in all, but never stalls).

    Raises:
        CallError: the server answered other than 200, broke off, or sent something not JSON.
    """
    request = {**body, "stream": True}
    try:
        async with (
            httpx.AsyncClient(timeout=limits, headers=headers) as client,
            client.stream("POST", f"{url}/v1/chat/completions", json=request) as reply,
        ):
            if reply.status_code != 200:
                detail = (await reply.aread()).decode("utf-8", errors="replace")[:300]
                raise CallError(f"the server answered {reply.status_code}: {detail}")
            async for line in reply.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                yield time.monotonic(), json.loads(line.removeprefix("data: "))
    except httpx.HTTPError as exc:
        raise CallError(f"the request to {url} failed: {exc}") from exc
    except ValueError as exc:
        raise CallError(f"the server sent a reply that is not JSON: {exc}") from exc
