"""The hang watch of a served set's model processes (the single server's is
:mod:`~lucebox.engine.run.serverrun.serversampling`).

The router itself never runs a request: each loaded model's process does, on its own loopback
port (``/models`` names it in the process's argv). The run looks at the ``/slots`` and
``/metrics`` of each one answering a request once a poll (:func:`look_at_child`, shared with
the speculation guard), keeps a :class:`hang.Watch` per model, and kills the process of one
whose running request makes no progress within the bound of its phase. The router then
answers the waiting request with an error, marks the model failed, and loads it again on the
next request; the other models run on.
"""

from __future__ import annotations

import contextlib
import signal
import time
from dataclasses import dataclass
from typing import Any

import httpx
import psutil

from lucebox.engine.run.hang import HangBounds, Watch, hung, observe, silent_watch
from lucebox.engine.run.kinds.metrics import look_of, parse_counters

CHILD_HOST = "127.0.0.1"
"""Where the router's model processes listen (CHILD_ADDR of tools/server/server-models.cpp)."""
CHILD_LOOK_TIMEOUT_S = 2.0
"""A stopped process answers nothing: the look gives up soon, so the set's poll goes on."""


def child_client(timeout_s: float) -> httpx.AsyncClient:
    """A client for the model processes' own ports that keeps no idle connection: a process's
    HTTP server waits for an open one before it exits, 0.1 s more on each unload, which an
    evicting request waits out before the model it asked for loads (the router's own calls to
    a process close theirs)."""
    return httpx.AsyncClient(timeout=timeout_s, limits=httpx.Limits(max_keepalive_connections=0))


@dataclass(frozen=True)
class ChildLook:
    """One look at a model process: what its ``/slots`` and ``/metrics`` said, read once a
    poll for both the hang watch and the speculation guard."""

    port: int
    slots: list[Any] | None
    """None: the process did not answer (a stopped one answers nothing)."""
    counters: dict[str, float]
    """Empty when ``/metrics`` did not answer."""
    at_s: float

    @property
    def busy(self) -> bool:
        """Whether it runs a request (unknown counts as busy)."""
        if self.slots is None:
            return True
        return any(isinstance(s, dict) and s.get("is_processing") for s in self.slots)


async def look_at_child(client: httpx.AsyncClient, port: int) -> ChildLook:
    """Ask a model process for its ``/slots`` and ``/metrics``, each within a short bound."""
    url = f"http://{CHILD_HOST}:{port}"
    slots: list[Any] | None = None
    with contextlib.suppress(httpx.HTTPError, ValueError):
        found = (await client.get(f"{url}/slots", timeout=CHILD_LOOK_TIMEOUT_S)).json()
        slots = found if isinstance(found, list) else None
    counters: dict[str, float] = {}
    if slots is not None:
        with contextlib.suppress(httpx.HTTPError):
            page = await client.get(f"{url}/metrics", timeout=CHILD_LOOK_TIMEOUT_S)
            if page.status_code == 200:
                counters = parse_counters(page.text)
    return ChildLook(port, slots, counters, time.monotonic())


class ChildHangWatch:
    """One watch per model answering a request; :meth:`check` after each ``/models`` poll."""

    def __init__(self, bounds: HangBounds) -> None:
        self.bounds = bounds
        self._watches: dict[str, Watch] = {}

    def check(self, looks: dict[str, ChildLook], router_pid: int | None) -> list[tuple[str, str]]:
        """Each answering model's look (by alias) judged; those found hung are killed:
        (alias, why) for each."""
        self._watches = {a: w for a, w in self._watches.items() if a in looks}
        found = []
        for alias, child in looks.items():
            before = self._watches.get(alias, Watch())
            if child.slots is None and before.since_s is None:
                # Loaded and answering a request, yet silent to the first look (a process
                # stopped before any look is still caught, by a longer bound).
                watch = silent_watch(child.at_s)
            else:
                look = (
                    look_of(child.slots, child.counters, child.at_s)
                    if child.slots is not None
                    else None
                )
                watch = observe(before, look, child.at_s)
            self._watches[alias] = watch
            rate = child.counters.get("prompt_tokens_seconds") or None
            why = hung(watch, time.monotonic(), rate, self.bounds)
            if why is None:
                continue
            del self._watches[alias]
            if router_pid is not None and kill_child(router_pid, child.port):
                found.append((alias, why))
        return found


def kill_child(router_pid: int, port: int) -> bool:
    """Kill the router's model process serving on ``port``; whether one was found."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(router_pid).children():
            with contextlib.suppress(psutil.Error):
                argv = child.cmdline()
                if "--port" in argv[:-1] and argv[argv.index("--port") + 1] == str(port):
                    child.send_signal(signal.SIGKILL)
                    return True
    return False
