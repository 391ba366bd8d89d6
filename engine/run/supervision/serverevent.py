"""What the supervisor reports: one engine's start, readiness, exit, restart, sleep and end."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lucebox.engine.run.death import EngineDeath

EventKind = Literal[
    "starting", "loading", "ready", "exited", "restarting", "sleeping", "gave-up", "stopped"
]
FINAL: frozenset[EventKind] = frozenset({"gave-up", "stopped"})
"""The events after which :meth:`Supervisor.events` ends."""


@dataclass(frozen=True)
class ServerEvent:
    kind: EventKind
    message: str
    pid: int | None = None
    cause: EngineDeath | None = None
    """Why the engine died (or was not started), on exited, restarting after a death and
    gave-up."""
    restarts: int = 0
    ctx: int | None = None
    """The context this engine serves (a re-plan after running out of memory changes it)."""
    planned: bool = False
    """A restart lucebox asked for itself (a calibration's trial, the speculation guard, the
    restart key), not one after a crash."""
