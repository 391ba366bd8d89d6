"""Whether the engine behind the front takes requests now, and the waiting for it: a request
that arrives while the engine starts, restarts or sleeps waits at the gate until it opens, the
run ends, or its wait runs out."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from lucebox.engine.run.front.frontwire import Exchange
    from lucebox.engine.run.runstate import Status

STATE_POLL_S = 0.5
"""How often a waiting request looks whether the run ended."""
ENDED_STATES = ("stopped", "failed")
"""Run states no engine comes back from: a waiting request is answered 503 at once."""
LOADING_BODY = b'{"error":{"message":"Loading model","type":"unavailable_error","code":503}}'
"""llama-server's answer to every route while it loads (its contract, server-http.cpp)."""


class EngineGate:
    """Open while the engine takes requests; the run opens and closes it (:meth:`engine_ready`)."""

    def __init__(self, status: Callable[[], Status]) -> None:
        self.status = status
        """The run's status now: whether it ended, or sleeps."""
        self._ready = asyncio.Event()
        self._ready.set()
        self._down_since_s = 0.0
        """When the engine last went down: every request held for it shares one deadline."""

    @property
    def is_open(self) -> bool:
        return self._ready.is_set()

    def engine_ready(self, ready: bool) -> None:
        if ready:
            self._ready.set()
        elif self._ready.is_set():
            self._ready.clear()
            self._down_since_s = time.monotonic()

    async def opened(
        self,
        ex: Exchange,
        arrived_s: float,
        wait_s: float,
        quiet_s: float,
        quiet: Callable[[], Awaitable[None]] | None = None,
    ) -> str | None:
        """Wait while the engine starts or restarts (``quiet`` is awaited every ``quiet_s``
        of it); None once open, or the run's state when the wait is given up: the run ended,
        or the engine was not back within ``wait_s``, counted from when it went down or the
        request arrived, the later (each one queued behind it would wait the whole bound
        again otherwise; time spent queued while it served is no part of the wait)."""
        deadline_s = max(arrived_s, self._down_since_s) + wait_s
        opened = asyncio.ensure_future(self._ready.wait())
        said_s = time.monotonic()
        try:
            while not opened.done():
                state = self.status().state
                now_s = time.monotonic()
                if state in ENDED_STATES or now_s >= deadline_s:
                    return state
                if quiet is not None and now_s - said_s >= quiet_s:
                    await quiet()
                    said_s = now_s
                await ex.wait(opened, STATE_POLL_S)
        finally:
            opened.cancel()
        return None

    async def closes_within(self, grace_s: float) -> bool:
        """Whether the run marks the engine down within ``grace_s`` (after its connection
        broke: it is then restarting, and the request can wait for it)."""
        deadline_s = time.monotonic() + grace_s
        while self._ready.is_set():
            if time.monotonic() >= deadline_s:
                return False
            await asyncio.sleep(STATE_POLL_S / 5)
        return True

    async def answer_closed(self, ex: Exchange, cors: list[tuple[str, str]]) -> None:
        """What llama-server answers while it loads, so health checks wait instead of failing
        (502); once the run has ended, that no engine comes back."""
        state = self.status().state
        if state in ENDED_STATES:
            await ex.error(503, f"the engine is not serving ({state}); start it again", cors)
            return
        await ex.whole(503, LOADING_BODY, extra=[("retry-after", "1"), *cors])
