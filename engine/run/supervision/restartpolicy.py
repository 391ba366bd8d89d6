"""When a dead engine starts again: the crashes counted in a window, the backoff between
them, one retry at a smaller context after running out of memory, and when to give up."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from lucebox.engine.plan.launch import ServerLaunch
from lucebox.engine.run.death import EngineDeath


@dataclass
class RestartPolicy:
    max_crashes: int = 5
    window_s: float = 600.0
    first_backoff_s: float = 1.0
    max_backoff_s: float = 30.0


def _crashes(count: int) -> str:
    return f"{count} crash" if count == 1 else f"{count} crashes"


class CrashHistory:
    """The engine's recent crashes, judged by the policy passed on each call (a run may
    change its policy between them)."""

    def __init__(self) -> None:
        self._crash_times: list[float] = []
        self._oom_retried = False

    def count(self, policy: RestartPolicy) -> None:
        now = time.monotonic()
        self._crash_times = [t for t in self._crash_times if now - t < policy.window_s]
        self._crash_times.append(now)

    def next_launch(
        self,
        death: EngineDeath,
        launch: ServerLaunch,
        policy: RestartPolicy,
        replan_on_oom: Callable[[ServerLaunch], ServerLaunch | None] | None,
    ) -> ServerLaunch | None:
        """The launch to start after ``death``: ``launch`` again, a re-planned one after
        running out of memory, or None to give up."""
        if not death.retry:
            return None  # the same command fails the same way: do not hammer it
        if death.code == "gpu-out-of-memory" and replan_on_oom is not None:
            if self._oom_retried:
                return None  # the re-planned launch ran out of memory too: do not hammer it
            self._oom_retried = True
            return replan_on_oom(launch)
        if len(self._crash_times) >= policy.max_crashes:
            return None
        return launch

    def backoff(
        self, next_launch: ServerLaunch, launch: ServerLaunch, policy: RestartPolicy
    ) -> tuple[float, str]:
        """The wait before ``next_launch`` starts, doubling with each crash in the window, and
        the restart's message (a re-planned launch says why it differs from ``launch``)."""
        backoff_s = min(
            policy.max_backoff_s,
            policy.first_backoff_s * 2 ** (len(self._crash_times) - 1),
        )
        if next_launch is not launch:
            ctx = next_launch.plan.ctx
            return backoff_s, f"out of memory: retrying once at a smaller context ({ctx} tokens)"
        return backoff_s, f"restarting in {backoff_s:.0f} s"

    def gave_up(self, policy: RestartPolicy, death: EngineDeath) -> str:
        """The give-up's message: how many crashes in how long, and the last death."""
        crashes = _crashes(len(self._crash_times))
        return f"gave up after {crashes} in {policy.window_s:.0f} s: {death.code}: {death.sentence}"
