"""An engine's death named from its last lines and from the machine as it is at that moment,
compared with what was read as it started."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

from lucebox.engine.engines import kinds
from lucebox.engine.machine.ports import down_peers
from lucebox.engine.plan.launch import ServerLaunch
from lucebox.engine.run.death import (
    DeathFacts,
    EngineDeath,
    FileStamp,
    changed_file,
    host_ram_terms,
    name_death,
)
from lucebox.engine.run.deathfacts import file_stamp, oom_kills, oom_kills_since, ram_users

DEATH_LINES = 60
"""The engine's last lines read to name its death."""


@dataclass(frozen=True)
class EngineStart:
    """What is read as an engine starts, for its death to be compared with."""

    files: tuple[FileStamp, ...]
    """The model and draft files as they were."""
    lines_before: int
    """The lines earlier engines had written: this engine's own come after them."""
    oom_kills: int | None
    """The kernel's out-of-memory kills so far."""


def engine_start(launch: ServerLaunch, lines_before: int) -> EngineStart:
    paths = (launch.model_path, launch.draft_path)
    files = tuple(stamp for path in paths if path and (stamp := file_stamp(path)))
    return EngineStart(files, lines_before, oom_kills())


@dataclass(frozen=True)
class EngineBuild:
    """What lucebox knows of the engine build that ran, for a death to name its next step."""

    cpu_target: str | None
    rebuild_target: str | None
    rebuilt_from: str | None
    model_name: str | None


def name_engine_death(
    returncode: int,
    ring: Sequence[str],
    lines_total: int,
    start: EngineStart,
    launch: ServerLaunch,
    build: EngineBuild,
    *,
    stopped_why: str | None,
    hung_why: str | None,
) -> EngineDeath:
    """The engine's death named from what is known now (the facts are read here)."""
    own_lines = min(lines_total - start.lines_before, len(ring), DEATH_LINES)
    lines = list(ring)[-own_lines:] if own_lines > 0 else []
    killed = returncode == -signal.SIGKILL and stopped_why is None and hung_why is None
    now = {stamp.path: file_stamp(stamp.path) for stamp in start.files}
    facts = DeathFacts(
        stopped_why=stopped_why,
        cpu_target=build.cpu_target,
        rebuild_target=build.rebuild_target if returncode == -signal.SIGILL else None,
        rebuilt_from=build.rebuilt_from,
        build_command=kinds.kind(launch.kind).build_command,
        changes=tuple(
            change
            for stamp in start.files
            if (change := changed_file(stamp, now[stamp.path])) is not None
        ),
        model_name=build.model_name,
        host_ram_terms=host_ram_terms(launch.plan.memory_bytes) if killed else None,
        ram_available_bytes=psutil.virtual_memory().available if killed else None,
        ram_users=ram_users() if killed else (),
        oom_kills_since_start=oom_kills_since(start.oom_kills) if killed else None,
        down_peers=down_peers(launch.rpc),
        hung_why=hung_why,
    )
    return name_death(returncode, lines, facts)
