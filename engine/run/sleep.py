"""Sleep without forgetting: the decisions, pure.

After ``server.sleep_idle_s`` seconds without a client request the engine is stopped (its slot
saved first, as on every planned stop) and the GPU is free, while the front keeps listening on
the same port; the next request starts the same launch again, which restores the slot, and is
served then. :mod:`sleepwatch` applies these decisions to a run; `lucebox status` reads
:class:`SleepStatus` (this module imports no HTTP client or asyncio).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

POLLED_PATHS = frozenset({"/health", "/v1/health", "/v1/models", "/models", "/metrics"})
"""What clients and monitors poll: answered while asleep, and never counted as activity (an
engine woken by each poll would never sleep)."""


SLEEP_CHOICES_S = (0.0, 300.0, 900.0, 3600.0)
"""The idle times offered where one is picked (off, 5 min, 15 min, 1 h); any other is taken."""
RULE = (
    "After this long without a client request the engine stops and frees the GPU, while the "
    "server keeps listening. The conversation is saved, and the next request wakes the "
    "engine: that request waits as long as the engine takes to start."
)
"""What sleeping does, for whoever chooses ``server.sleep_idle_s``."""


def idle_text(idle_s: float) -> str:
    """``off``, ``5 min``, ``1 h``, ``1 h 30 min`` or ``90 s``: an idle time for people."""
    if idle_s <= 0:
        return "off"
    if idle_s % 60:
        return f"{idle_s:g} s"
    hours, minutes = divmod(int(idle_s) // 60, 60)
    shown = [f"{hours} h"] if hours else []
    return " ".join([*shown, f"{minutes} min"] if minutes else shown)


def counts_as_activity(method: str, path: str) -> bool:
    """Whether a client's request to the front keeps the engine awake (and wakes it)."""
    return method != "OPTIONS" and path not in POLLED_PATHS


def idle_since(last_active_s: float, now_s: float, *, busy: bool, serving: bool) -> float:
    """When the idle time starts counting (monotonic): now while a request runs or waits, or
    while the engine does not serve (its load, a restart, lucebox's own measurement are no
    idle time); else as it was."""
    return now_s if busy or not serving else last_active_s


def sleep_due(idle_s: float, last_active_s: float, now_s: float) -> bool:
    """Whether the engine has been idle long enough to sleep; ``idle_s`` 0 never sleeps."""
    return idle_s > 0 and now_s - last_active_s >= idle_s


@dataclass(frozen=True)
class SleepStatus:
    """Whether the engine sleeps, since when, and after how long idle it does."""

    asleep: bool
    since: float
    """Unix time it went to sleep or last woke (or the run started)."""
    idle_s: float
    """``server.sleep_idle_s``."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> SleepStatus | None:
        if not isinstance(data, dict):
            return None
        asleep, since, idle_s = data.get("asleep"), data.get("since"), data.get("idle_s")
        if not isinstance(asleep, bool) or not isinstance(since, int | float):
            return None
        if not isinstance(idle_s, int | float):
            return None
        return cls(asleep, float(since), float(idle_s))
