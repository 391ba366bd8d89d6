"""The sleep watch of a running server: it puts the engine to sleep once idle and wakes it on
the next client request (the decisions are :mod:`sleep`'s)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from lucebox.engine.run.sleep import SleepStatus, counts_as_activity, idle_since, sleep_due

if TYPE_CHECKING:
    from lucebox.engine.run.front.front import Front
    from lucebox.engine.run.runsetup import Calibrations
    from lucebox.engine.run.runstate import Status
    from lucebox.engine.run.supervisor import Supervisor


class SleepingRun(Protocol):
    """What the watch needs of the run it puts to sleep (:class:`~lucebox.engine.run.
    serverrun.serverrun.ServerRun` is one)."""

    front: Front | None
    supervisor: Supervisor
    calibrations: Calibrations

    @property
    def status(self) -> Status: ...


SLEEP_CHECK_S = 0.5
"""How often the watch looks whether the engine is idle enough to sleep."""


@dataclass(frozen=True)
class SleepHooks:
    """What the watch asks of the run."""

    busy: Callable[[], bool]
    """Whether a request runs or waits, or lucebox measures the engine."""
    serving: Callable[[], bool]
    """Whether the engine serves now (ready)."""
    fall_asleep: Callable[[], None]
    """Stop the engine, keeping the front."""
    wake: Callable[[], None]
    """Start it again with the same launch."""


class SleepWatch:
    """Sleeps the engine after ``idle_s`` without client requests; :meth:`saw_request` (the
    front's hook) wakes it."""

    def __init__(self, idle_s: float, hooks: SleepHooks) -> None:
        self.idle_s = idle_s
        self.hooks = hooks
        self.asleep = False
        self.since = time.time()
        self._last_active_s = time.monotonic()

    def saw_request(self, method: str, path: str) -> None:
        """A client's request reached the front: it counts as activity (polls do not), and an
        asleep engine is started for it (the front holds it meanwhile)."""
        if not counts_as_activity(method, path):
            return
        self._last_active_s = time.monotonic()
        if self.asleep:
            self.asleep, self.since = False, time.time()
            self.hooks.wake()

    def restarted(self) -> None:
        """A restart starts an engine that sleeps: it is awake from now (no second start)."""
        if self.asleep:
            self.asleep, self.since = False, time.time()

    def status(self) -> SleepStatus:
        return SleepStatus(self.asleep, self.since, self.idle_s)

    def step(self, now_s: float) -> None:
        """One look: the engine goes to sleep when it has been idle long enough."""
        if self.asleep:
            return
        hooks = self.hooks
        self._last_active_s = idle_since(
            self._last_active_s, now_s, busy=hooks.busy(), serving=hooks.serving()
        )
        if sleep_due(self.idle_s, self._last_active_s, now_s):
            self.asleep, self.since = True, time.time()
            hooks.fall_asleep()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(SLEEP_CHECK_S)
            self.step(time.monotonic())


def sleep_watch(run: SleepingRun, idle_s: float) -> SleepWatch | None:
    """The watch of ``run`` after ``idle_s`` idle; None when it never sleeps."""
    if idle_s <= 0:
        return None

    def busy() -> bool:
        front = run.front
        return (front is not None and front.queue.activity()[0] > 0) or run.calibrations.measuring

    def fall_asleep() -> None:
        run.supervisor.sleep()
        if run.front is not None:
            run.front.engine_ready(False)  # requests from now on wait for the wake

    return SleepWatch(
        idle_s,
        SleepHooks(
            busy=busy,
            serving=lambda: run.status.state == "ready",
            fall_asleep=fall_asleep,
            wake=run.supervisor.wake,
        ),
    )
