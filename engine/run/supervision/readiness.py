"""When a started engine serves: its /health answers 200, then its own warm-up passes."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx

from lucebox.engine.core.waits import event_within
from lucebox.engine.plan.launch import ServerLaunch, engine_url
from lucebox.engine.run.kinds.enginerun import engine_run
from lucebox.engine.run.kinds.ownrequests import OwnRequests
from lucebox.engine.run.supervision.enginelog import RotatingLog

HEALTH_INTERVAL_S = 0.05
"""While loading, the engine answers /health with 503 in well under a millisecond: asking
often costs nothing and lets ready follow the engine closely."""


async def wait_ready(
    launch: ServerLaunch,
    process: asyncio.subprocess.Process,
    *,
    ready_timeout_s: float,
    stopping: asyncio.Event,
    own_requests: OwnRequests,
    log: RotatingLog,
    woken: bool,
) -> str | None:
    """None once the engine serves; else why it does not (it exited, it was not ready in
    time, its warm-up failed, a stop was asked for)."""
    url = engine_url(launch) + "/health"
    deadline = time.monotonic() + ready_timeout_s
    async with httpx.AsyncClient(timeout=2.0) as client:
        while time.monotonic() < deadline and process.returncode is None:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(url)).status_code == 200:
                    return await warmed_up(launch, client, own_requests, log, woken=woken)
            if await event_within(stopping, HEALTH_INTERVAL_S):
                return "a stop was asked for"
    return f"it was not ready within {ready_timeout_s:.0f} s"


async def warmed_up(
    launch: ServerLaunch,
    client: httpx.AsyncClient,
    own_requests: OwnRequests,
    log: RotatingLog,
    *,
    woken: bool,
) -> str | None:
    """The engine's own warm-up (:meth:`EngineRun.warm_up`) passes before it counts as
    ready, so a failure it provokes comes now, not to a user, and before the ready event,
    on which the run restores the saved slot; what failed, or None."""
    run = engine_run(launch.kind)
    if not run.sends_warm_up(launch, woken=woken):
        return None  # nothing sent: no own request for the log to claim
    with own_requests.sending() as answered:
        failure = await run.warm_up(client, engine_url(launch), launch)
        if failure is None:
            answered.append(True)
    log.write(f"# lucebox: warm-up {'answered' if failure is None else failure}")
    return None if failure is None else f"its warm-up request failed: {failure}"
