"""What each key used since the server started: requests, generated tokens, when last seen.

The front counts every admitted request under the name of the key it carried (a person's, or
``server.api_key``); `status`, `lucebox keys list` and ``/metrics`` show the counts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from lucebox.engine.run.sample import KeyUse


@dataclass
class _Tally:
    requests: int = 0
    tokens: int = 0
    last_seen_s: float = 0.0


class KeyTally:
    def __init__(self) -> None:
        self._by_name: dict[str, _Tally] = {}

    def count(self, name: str | None, tokens: int) -> None:
        """One request of the key ``name`` (None: a request that needed no key)."""
        if name is None:
            return
        tally = self._by_name.setdefault(name, _Tally())
        tally.requests += 1
        tally.tokens += tokens
        tally.last_seen_s = time.time()

    def status(self) -> tuple[KeyUse, ...]:
        return tuple(
            KeyUse(
                name,
                t.requests,
                t.tokens,
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t.last_seen_s)),
            )
            for name, t in sorted(self._by_name.items())
        )
