"""lucebox's own requests to the engine (the Lucebox engine's warm-up, the calibrations' probes),
told apart from clients' in the engine's log so that no client total, rate or time to first
token counts them.

Own requests go to the engine's private port, never through the front, so the only place they
mix with clients' is the engine's log. A finished request the log reports is lucebox's own when
an own request was answered and its line has not been claimed yet, or while one is in flight
(its line may come before the answer reaches lucebox); each answer and each line pair once.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator


class OwnRequests:
    """The ledger one run keeps of its own requests to the engine."""

    def __init__(self) -> None:
        self.in_flight = 0
        self._answers = 0
        """Own requests answered whose finished line the log has not reported yet."""
        self._lines = 0
        """Finished lines claimed while an own request was in flight, not yet answered."""
        self.last_sent_s: float | None = None
        """When the last own request was sent (``time.monotonic``): it took the engine's slot."""

    @contextlib.contextmanager
    def sending(self) -> Iterator[list[bool]]:
        """Around one own request; the caller appends True to the yielded list once the engine
        answered it whole (an answer means the engine finished it and logs it)."""
        answered: list[bool] = []
        self.in_flight += 1
        self.last_sent_s = time.monotonic()
        try:
            yield answered
        finally:
            self.in_flight -= 1
            if answered:
                if self._lines > 0:
                    self._lines -= 1
                else:
                    self._answers += 1
            # A request that was given up may never reach the log: no line waits for it.
            self._lines = min(self._lines, self.in_flight)

    def claims(self) -> bool:
        """Whether the request the log just reported finished is lucebox's own."""
        if self._answers > 0:
            self._answers -= 1
            return True
        if self.in_flight > self._lines:
            self._lines += 1
            return True
        return False

    def new_engine(self) -> None:
        """A new engine process: nothing it logs answers an earlier engine's request."""
        self._answers = 0
        self._lines = 0
