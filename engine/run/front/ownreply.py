"""What the front writes to a client on its own, the engine's answer aside: an error (a whole
answer, or the last event of a stream already started), the SSE head of a stream it starts
before the engine answers, and the keep-alive comments of a silent stream."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from lucebox.engine.run.front.frontwire import KEEPALIVE_COMMENT

if TYPE_CHECKING:
    from lucebox.engine.run.front.frontcounters import FrontCounters
    from lucebox.engine.run.front.frontwire import Exchange

SSE_HEAD = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]


async def failed(ex: Exchange, counters: FrontCounters, status: int, message: str) -> None:
    """The error as an answer, or as the last event of a stream already started."""
    counters.answered[status] += 1
    if ex.started:
        # Both SDKs raise on it: OpenAI's on an "error" member, Anthropic's on the event.
        error = json.dumps({"type": "error", "error": {"code": status, "message": message}})
        await ex.data(f"event: error\ndata: {error}\n\n".encode())
        await ex.end()
    else:
        await ex.error(status, message)


async def sse_started(ex: Exchange, cors: list[tuple[str, str]]) -> None:
    """The front's own SSE head, once: a stream hears from the front before the engine."""
    if not ex.started:
        await ex.head(200, [*SSE_HEAD, *cors])


async def keepalive(ex: Exchange, counters: FrontCounters) -> None:
    counters.keepalives += 1
    await ex.data(KEEPALIVE_COMMENT)


def stopped_midway(how: str) -> str:
    return (
        f"the engine stopped in the middle of this reply ({how}); lucebox starts it again: "
        "send the request again"
    )
