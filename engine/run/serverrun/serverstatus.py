"""What a server run says of itself: the state file `lucebox status` reads (its state after
each supervisor event, its engine kind, peers and front) and the record `lucebox connect`
reads once it has ended."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace

from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import kinds
from lucebox.engine.engines.registry import KindName
from lucebox.engine.machine.ports import down_peers
from lucebox.engine.plan.launch import ServerLaunch
from lucebox.engine.plan.sidemodels import SideModel
from lucebox.engine.run.calibrate.enginecalibrator import EngineCalibrator
from lucebox.engine.run.calibrate.kvcalibrator import KvModeCalibrator
from lucebox.engine.run.front.front import Front
from lucebox.engine.run.kinds.enginelog import EngineLog
from lucebox.engine.run.lastserved import LastServed, served_now
from lucebox.engine.run.runsetup import RunFacts
from lucebox.engine.run.runstate import RunStateName, Status, engine_log
from lucebox.engine.run.sample import EngineStatus, PeerStatus, Sample, SpecStatus
from lucebox.engine.run.sideserver import SideServers
from lucebox.engine.run.sleepwatch import SleepWatch
from lucebox.engine.run.supervision.serverevent import ServerEvent

_STATE_OF_EVENT: dict[str, RunStateName] = {
    "starting": "starting",
    "loading": "loading",
    "ready": "ready",
    "exited": "restarting",
    "restarting": "restarting",
    "sleeping": "sleeping",
    "gave-up": "failed",
    "stopped": "stopped",
}


def state_of(event: ServerEvent) -> RunStateName:
    return _STATE_OF_EVENT[event.kind]


def planned_spec(spec_type: str | None, reason: str | None) -> SpecStatus | None:
    """Speculation as planned, before the engine says whether it runs; None when none is."""
    if spec_type is None:
        return None
    return SpecStatus(spec_type, None, reason or f"{spec_type} as planned", None, None)


def first_status(
    paths: Paths, launch: ServerLaunch, facts: RunFacts, public_url: str, spec_reason: str | None
) -> Status:
    """The status of a run about to start ``launch``, served at ``public_url``."""
    return Status(
        "starting",
        pid=os.getpid(),
        url=public_url,
        model=facts.model,
        started_at=time.time(),
        ctx=launch.plan.ctx,
        log=str(engine_log(paths)),
        spec=planned_spec(launch.spec_type, spec_reason),
        webui_url=facts.webui_url,
        peers=facts.peers,
        vision=launch.mmproj_path,
    )


@dataclass
class RunState:
    """What changes while a server runs: its status, last sample and the engine's log facts."""

    status: Status
    sample: Sample | None = None
    logs: dict[int, EngineLog] = field(default_factory=dict)
    """The engine's log facts per engine process, fed line by line by the supervisor."""


def engine_status(
    planned: EngineStatus | None, kind: str, calibration: EngineCalibrator | None
) -> EngineStatus | None:
    """The engine kind serving now and what chose it: a trial while the engine calibration
    runs it, the verdict once it is the measured one, else what the plan said."""
    if planned is None:
        return None
    if calibration is not None and calibration.active and calibration.kind == kind:
        return EngineStatus(kind, "trial", "measured against the other engine now")
    verdict = calibration.measurement if calibration is not None else None
    if verdict is not None and verdict.chosen == kind and planned.chosen_by != "asked":
        return EngineStatus(kind, "measured", verdict.why)
    if planned.kind == kind:
        return planned
    return EngineStatus(kind, "rule", "")


def status_after(status: Status, event: ServerEvent, planned_restarts: int, ctx: int) -> Status:
    """``status`` once the supervisor said ``event``, with its count of planned restarts and
    the context the engine serves now."""
    return replace(
        status,
        state=state_of(event),
        restarts=event.restarts,
        planned_restarts=planned_restarts,
        engine_pid=event.pid,
        ctx=ctx,
        peers=peers_after(status.peers, event),
        cause=event.cause or status.cause,
    )


def peers_after(peers: tuple[PeerStatus, ...], event: ServerEvent) -> tuple[PeerStatus, ...]:
    """The peers' state: lost when the engine exited and its RPC server does not answer."""
    if event.kind == "ready":
        return tuple(replace(p, state="up") for p in peers)
    if event.kind != "exited" or not peers:
        return peers
    down = set(down_peers(tuple(p.address for p in peers)))
    return tuple(replace(p, state="lost" if p.address in down else "up") for p in peers)


def status_now(
    status: Status,
    *,
    engine: EngineStatus | None,
    sides: SideServers,
    front: Front | None,
    sleep: SleepWatch | None,
    kv_modes: KvModeCalibrator | None,
    kind: KindName,
) -> Status:
    """``status`` with what the run's parts say now: the engine kind, the side models, the
    front's queue, keys and sampling, and the long-context modes of engine ``kind``."""
    status = replace(status, engine=engine, sides=sides.status())
    if front is not None:
        status = replace(
            status,
            queue=front.queue_status(),
            keys=front.key_use.status(),
            sampling=front.sampling.status(),
            sleep=sleep.status() if sleep is not None else None,
        )
    if kv_modes is not None:
        # None while the engine calibration serves the launch on a kind without them.
        has_modes = kinds.kind(kind).serves_kv_modes
        status = replace(status, kv_modes=kv_modes.status() if has_modes else None)
    return status


def served_record(
    public_url: str, aliases: tuple[str, ...], launch: ServerLaunch, sides: tuple[SideModel, ...]
) -> LastServed:
    """The address and aliases `lucebox connect` reads once the run has ended."""
    return served_now(
        public_url,
        aliases,
        launch.plan.ctx,
        api_key_file=launch.api_key_file,
        on_gpu=bool(launch.gpus or launch.rpc),
        weights_bytes=launch.plan.memory_bytes.weights,
        embed_model=next((s.alias for s in sides if s.role == "embeddings"), None),
    )
