"""lucebox's front on a server run's served address, opened before the engine starts behind it,
and the run's name on the LAN while it serves beyond loopback (announce.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from lucebox.engine.core.paths import Paths
from lucebox.engine.machine.personkeys import keys_path, read_keys
from lucebox.engine.machine.ports import next_free_port, port_holder
from lucebox.engine.plan.launch import ServerLaunch, engine_url
from lucebox.engine.run.announce import Announced, Announcer, lan_addresses
from lucebox.engine.run.death import EngineDeath, port_taken
from lucebox.engine.run.front.apishape import Shapes
from lucebox.engine.run.front.front import Front, start_front
from lucebox.engine.run.front.frontguard import server_policy
from lucebox.engine.run.front.frontsetup import FrontSetup
from lucebox.engine.run.kinds.enginerun import engine_run
from lucebox.engine.run.runsetup import RunFacts
from lucebox.engine.run.runstate import Status
from lucebox.engine.run.sample import LanStatus
from lucebox.engine.run.sideserver import side_route
from lucebox.engine.run.supervision.enginelog import RotatingLog
from lucebox.engine.run.supervisor import Supervisor


def front_setup(
    launch: ServerLaunch, facts: RunFacts, paths: Paths, engine_wait_s: float
) -> FrontSetup:
    """What the front serves for ``launch``: who may use it, the model, its capacity."""
    api_key = facts.api_key
    run = engine_run(launch.kind)
    return FrontSetup(
        policy=server_policy(
            launch.host,
            launch.port,
            api_key,
            keys_path(paths),
            facts.allowed_origins,
        ),
        model=launch.alias,
        ctx=launch.plan.ctx,
        capacity=run.parallel(launch),
        engine_key=api_key if run.reads_key_file else None,
        engine_wait_s=engine_wait_s,
        images=launch.mmproj_path is not None,
        thinking_default=facts.thinking_default,
        sides=tuple(side_route(side, api_key) for side in facts.sides),
        page=facts.chat_page,
    )


@dataclass
class ServedFront:
    """The front listening on the served address, and the run's name on the LAN."""

    front: Front
    server: asyncio.Server
    announcer: Announcer | None = None
    lan: LanStatus | None = None
    """What `status` says of the LAN name; None while it serves loopback only."""

    def close(self) -> None:
        self.server.close()
        if self.announcer is not None:
            self.announcer.close()  # a second's unregistering, once, as the run ends
            self.announcer = None


async def open_front(
    setup: FrontSetup,
    facts: RunFacts,
    paths: Paths,
    supervisor: Supervisor,
    status: Callable[[], Status],
) -> ServedFront | EngineDeath:
    """The front on the served address, before the engine starts behind it, closed to
    clients until the engine says ready; what holds the address when it cannot listen."""
    launch = supervisor.launch
    front = Front(
        setup,
        lambda: engine_url(supervisor.launch),
        status=status,
        shape=Shapes(
            launch.kind,
            launch.alias,
            launch.plan.ctx,
            facts.thinking_default,
            facts.sampling,
            engine_run(launch.kind).reply_budget(launch),
        ),
        sampling=facts.sampling,
    )
    try:
        server = await start_front(front, launch.host, launch.port)
    except OSError:
        holder = port_holder(launch.host, launch.port) or "another program"
        return port_taken(launch.port, holder, next_free_port(launch.host, launch.port))
    front.engine_ready(False)  # until the engine behind it says ready
    if facts.no_page_reason:
        supervisor.log.write(f"# lucebox: no chat page: {facts.no_page_reason}")
    served = ServedFront(front, server)
    announced = await announce(launch, facts, paths, supervisor.log)
    if announced is not None:
        served.announcer, served.lan = announced
    return served


async def announce(
    launch: ServerLaunch, facts: RunFacts, paths: Paths, log: RotatingLog
) -> tuple[Announcer | None, LanStatus] | None:
    """The server on the LAN by name, and what `status` says of it; None when it serves
    loopback only. A LAN that refuses multicast costs the name, never the run."""
    addresses = lan_addresses(launch.host)
    if not addresses:
        return None
    what = Announced(
        facts.mdns_name,
        addresses,
        launch.port,
        launch.alias,
        launch.kind,
        key_needed=bool(facts.api_key) or bool(read_keys(keys_path(paths)).keys),
    )
    announcer = Announcer(what)
    try:
        name = await asyncio.to_thread(announcer.start)
    except OSError as exc:
        log.write(f"# lucebox: not announced on the LAN: {exc}")
        name = None
    return (announcer if name is not None else None), LanStatus(name, addresses, launch.port)
