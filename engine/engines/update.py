"""Engine updates: which build serves after ``engine update``, the way back, and when lucebox
takes that way back by itself.

The active build is ``engine.id`` in config.toml; the build it replaced is kept in a small state
file (``<state>/engine-update.json``, written whole) so ``engine rollback`` flips back in
seconds with nothing rebuilt. A new build that crash-loops within its first starts after the
switch is rolled back by itself (:func:`rollback_decision` decides, the supervisor's give-up
asks); an illegal instruction is not a reason, that death rebuilds one CPU baseline down.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from lucebox.engine.core.errors import UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import cputarget
from lucebox.engine.engines.build import BuildOptions
from lucebox.engine.engines.known import KnownSource
from lucebox.engine.engines.registry import EngineManifest, KindName, list_engines
from lucebox.engine.engines.updatestate import (
    AutoRollback,
    UpdateState,
    read_state,
    write_state,
)
from lucebox.engine.machine import config

ROLLBACK_WINDOW_STARTS = 3
"""A new build that gives up within this many starts after the switch is rolled back."""
NOT_A_ROLLBACK = frozenset({"illegal-instruction"})
"""Deaths that are not the build's fault to roll back for (the CPU rebuild takes them)."""


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def installed(paths: Paths, engine_id: str) -> EngineManifest | None:
    return next((e for e in list_engines(paths) if e.id == engine_id), None)


def installed_build_of(
    paths: Paths, kind: KindName, known: KnownSource[Any], options: BuildOptions
) -> EngineManifest | None:
    """An installed build of ``known`` made with ``options``: the same source identity and
    options make the same build key, so an update uses it rather than fetch and build again."""
    for engine in list_engines(paths):
        if engine.kind != kind or engine.source_identity != known.identity:
            continue
        if engine.build_options(engine.cpu_target or cputarget.NATIVE) == options:
            return engine
    return None


def activate(paths: Paths, kind: KindName, previous_id: str, new_id: str) -> UpdateState:
    """``new_id`` serves from now on (engine.id), ``previous_id`` is the way back."""
    config.set_setting(paths, "engine.id", new_id)
    state = UpdateState(kind, previous_id, new_id, _now())
    write_state(paths, state)
    return state


def rollback(paths: Paths) -> UpdateState:
    """Back to the build the last switch replaced: engine.id flips, nothing is rebuilt; the
    state then names the flip, so a second rollback undoes the first."""
    state = read_state(paths)
    if state is None:
        raise UsageError(
            "no engine update to roll back: the active build was never switched by "
            "`lucebox engine update`",
            hint="`lucebox engine status` lists the installed builds",
        )
    if installed(paths, state.previous_id) is None:
        raise UsageError(
            f"the previous build {state.previous_id} is no longer installed",
            hint="`lucebox engine status` lists the installed builds",
        )
    return activate(paths, state.kind, state.current_id, state.previous_id)


def count_start(paths: Paths, engine_id: str) -> UpdateState | None:
    """One more start of the build the last switch activated (other builds are not counted)."""
    state = read_state(paths)
    if state is None or state.current_id != engine_id or state.auto_rollback is not None:
        return state
    state = replace(state, starts=state.starts + 1)
    write_state(paths, state)
    return state


def rollback_decision(
    state: UpdateState | None, engine_id: str | None, death_code: str
) -> str | None:
    """Why the serving build ``engine_id``, which gave up with ``death_code``, is rolled back;
    None when it is not: it is not the build an update just activated, it served more than
    its first starts, or the death is one a rollback does not fix."""
    if state is None or engine_id is None or state.current_id != engine_id:
        return None
    if state.auto_rollback is not None or death_code in NOT_A_ROLLBACK:
        return None
    if state.starts > ROLLBACK_WINDOW_STARTS:
        return None
    return (
        f"{engine_id} crash-looped ({death_code}) in its first starts after `lucebox engine "
        f"update`: back to {state.previous_id}"
    )


def roll_back_after_give_up(paths: Paths, engine_id: str | None, death_code: str) -> str | None:
    """The supervisor's give-up: roll back when :func:`rollback_decision` says so, record why
    (``status --json`` shows it) and return the sentence; None when nothing changed."""
    state = read_state(paths)
    why = rollback_decision(state, engine_id, death_code)
    if why is None or state is None or installed(paths, state.previous_id) is None:
        return None
    config.set_setting(paths, "engine.id", state.previous_id)
    auto = AutoRollback(state.current_id, state.previous_id, death_code, _now(), why)
    flipped = UpdateState(state.kind, state.current_id, state.previous_id, auto.at)
    write_state(paths, replace(flipped, auto_rollback=auto))
    return why
