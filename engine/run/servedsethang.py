"""The hang watch of a served set's model processes (the single server's is in serverrun).

The router itself never runs a request: each loaded model's process does, on its own loopback
port (``/models`` names it in the process's argv). The run looks at each one's ``/slots`` and
``/metrics`` once a poll, keeps a :class:`hang.Watch` per model, and kills the process of one
whose running request makes no progress within the bound of its phase. The router then
answers the waiting request with an error, marks the model failed, and loads it again on the
next request; the other models run on.
"""

from __future__ import annotations

import contextlib
import signal
import time
from typing import Any

import httpx
import psutil

from lucebox.engine.run.hang import HangBounds, Look, Watch, hung, observe, silent_watch
from lucebox.engine.run.metrics import look_of, parse_counters

CHILD_HOST = "127.0.0.1"
"""Where the router's model processes listen (CHILD_ADDR of tools/server/server-models.cpp)."""
CHILD_LOOK_TIMEOUT_S = 2.0
"""A stopped process answers nothing: the look gives up soon, so the set's poll goes on."""


class ChildHangWatch:
    """One watch per loaded model of a set; :meth:`check` after each ``/models`` poll."""

    def __init__(self, bounds: HangBounds) -> None:
        self.bounds = bounds
        self._watches: dict[str, Watch] = {}

    async def check(
        self, client: httpx.AsyncClient, children: dict[str, int], router_pid: int | None
    ) -> list[tuple[str, str]]:
        """Each loaded model (alias -> its process's port) looked at once; those found hung
        are killed: (alias, why) for each."""
        self._watches = {a: w for a, w in self._watches.items() if a in children}
        found = []
        for alias, port in children.items():
            look, prefill_tokens_per_s = await _child_look(client, port)
            now_s = time.monotonic()
            before = self._watches.get(alias, Watch())
            if look is None and before.since_s is None:
                # Loaded and answering a request, yet silent to the first look (a process
                # stopped before any look is still caught, by a longer bound).
                watch = silent_watch(now_s)
            else:
                watch = observe(before, look, now_s)
            self._watches[alias] = watch
            why = hung(watch, now_s, prefill_tokens_per_s, self.bounds)
            if why is None:
                continue
            del self._watches[alias]
            if router_pid is not None and kill_child(router_pid, port):
                found.append((alias, why))
        return found


async def _child_look(client: httpx.AsyncClient, port: int) -> tuple[Look | None, float | None]:
    """A model process's look for the hang watch and its mean prefill rate (None: it did not
    answer, or has measured none); a stopped process answers nothing."""
    url = f"http://{CHILD_HOST}:{port}"
    try:
        slots: Any = (await client.get(f"{url}/slots", timeout=CHILD_LOOK_TIMEOUT_S)).json()
    except (httpx.HTTPError, ValueError):
        return None, None
    counters: dict[str, float] = {}
    with contextlib.suppress(httpx.HTTPError):
        page = await client.get(f"{url}/metrics", timeout=CHILD_LOOK_TIMEOUT_S)
        if page.status_code == 200:
            counters = parse_counters(page.text)
    rate = counters.get("prompt_tokens_seconds") or None
    listed = slots if isinstance(slots, list) else None
    return look_of(listed, counters, time.monotonic()), rate


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
