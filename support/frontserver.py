"""lucebox's front (engine/run/front/front.py) run on a thread of its own, in front of an engine
URL, for tests and benches that talk to it with plain blocking clients."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from lucebox.engine.plan.samplingdefaults import SamplingDefaults
from lucebox.engine.run.front.front import Front, start_front
from lucebox.engine.run.front.frontguard import FrontPolicy
from lucebox.engine.run.front.frontsetup import FrontSetup
from lucebox.engine.run.front.frontwire import ApiShape
from support.ports import free_port


@dataclass(frozen=True)
class RunningFront:
    url: str
    port: int
    front: Front
    loop: asyncio.AbstractEventLoop


@contextmanager
def running_front(
    spec: FrontSetup,
    engine_url: str,
    shape: ApiShape | None = None,
    sampling: SamplingDefaults | None = None,
) -> Iterator[RunningFront]:
    """The front on a free loopback port (``spec.policy``'s port is replaced by it), with the
    API shaping ``shape`` (serverrun gives it :class:`apishape.Shapes`) and the sampling
    defaults its mix counts unset fields as."""
    port = free_port()
    spec = replace(spec, policy=replace(spec.policy, port=port))
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, object] = {}

    stop = asyncio.Event()

    async def main() -> None:
        front = Front(spec, lambda: engine_url, shape=shape, sampling=sampling)
        server = await start_front(front, "127.0.0.1", port)
        holder["front"] = front
        ready.set()
        await stop.wait()
        server.close()
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()
        await asyncio.sleep(0.1)

    thread = threading.Thread(target=lambda: _run(loop, main()), daemon=True)
    thread.start()
    assert ready.wait(10), "the front did not start"
    front = holder["front"]
    assert isinstance(front, Front)
    try:
        yield RunningFront(f"http://127.0.0.1:{port}", port, front, loop)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)


def _run(loop: asyncio.AbstractEventLoop, main: object) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(main)  # type: ignore[arg-type]
    finally:
        loop.close()


def loopback_policy(api_key: str | None = None) -> FrontPolicy:
    return FrontPolicy(host="127.0.0.1", port=0, api_key=api_key)
