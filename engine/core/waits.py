"""Waiting with a bound that never swallows a cancellation.

Python 3.11's ``asyncio.wait_for`` returns the awaited result when the task is cancelled just
as that result arrives, so the cancel is lost: a sampler cancelled as a request finished
sampled on for ever and held `lucebox serve` up after SIGTERM. ``asyncio.timeout`` does not.
"""

from __future__ import annotations

import asyncio
import contextlib


async def event_within(event: asyncio.Event, timeout_s: float) -> bool:
    """Whether ``event`` was set within ``timeout_s``; a cancellation always propagates."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
        return True
    return False
