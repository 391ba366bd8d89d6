"""A bounded wait that a cancellation always ends (a sampler cancelled as a request finished
once sampled on for ever and held `lucebox serve` up after SIGTERM)."""

from __future__ import annotations

import asyncio

import pytest

from lucebox.engine.core.waits import event_within


async def test_a_cancel_that_comes_as_the_event_is_set_still_cancels():
    event = asyncio.Event()
    waiting = asyncio.create_task(event_within(event, 30))
    await asyncio.sleep(0)  # the wait has begun
    event.set()
    waiting.cancel()  # in the same turn of the loop: the result and the cancel race
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_the_wait_says_whether_the_event_came_within_its_bound():
    event = asyncio.Event()
    assert await event_within(event, 0.01) is False
    event.set()
    assert await event_within(event, 0.01) is True
