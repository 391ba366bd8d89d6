"""Engine updates' bookkeeping: the switch, the way back, and when lucebox takes it by itself."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from lucebox.engine.core.errors import UsageError
from lucebox.engine.core.paths import Paths, resolve_paths
from lucebox.engine.engines import install, kinds, update, updatestate
from lucebox.engine.engines.registry import EngineCapabilities, EngineManifest, list_engines
from lucebox.engine.engines.update import rollback_decision
from lucebox.engine.engines.updatestate import UpdateState
from lucebox.engine.machine import config


def installed_engine(
    paths: Paths,
    engine_id: str,
    source_identity: str | None = None,
    script: str = "#!/bin/sh\n",
    options: dict[str, Any] | None = None,
) -> Path:
    """A manifest in the engines folder whose server is ``script`` (list_engines needs a file);
    returns the server's path."""
    folder = paths.ensure(paths.engines_dir / engine_id)
    server = folder / "llama-server"
    server.write_text(script)
    server.chmod(0o755)
    manifest = EngineManifest(
        id=engine_id,
        backend="cpu",
        cuda_archs=(),
        version="test",
        server_path=str(server),
        origin="build",
        capabilities=EngineCapabilities((), (), None),
        source_identity=source_identity,
        options=options or {},
    )
    install.write_manifest(folder, manifest)
    return server


STATE = UpdateState("llama-server", "old", "new", "2026-11-27T00:00:00", starts=1)


def test_a_new_build_that_crash_loops_in_its_first_starts_is_rolled_back():
    why = rollback_decision(STATE, "new", "segfault")
    assert why is not None and "new crash-looped (segfault)" in why and "back to old" in why


@pytest.mark.parametrize(
    ("state", "engine_id", "code"),
    [
        (STATE, "new", "illegal-instruction"),  # the CPU rebuild's, never a rollback
        (STATE, "old", "segfault"),  # not the build the update activated
        (STATE, None, "segfault"),  # a binary lucebox did not install
        (None, "new", "segfault"),  # no update
        (
            UpdateState("llama-server", "old", "new", "", starts=update.ROLLBACK_WINDOW_STARTS + 1),
            "new",
            "segfault",
        ),  # it served through its first starts: the build is not the cause to assume
    ],
)
def test_no_rollback_outside_a_fresh_update_or_for_an_illegal_instruction(state, engine_id, code):
    assert rollback_decision(state, engine_id, code) is None


def test_activate_then_rollback_flips_engine_id_back_and_forth_without_a_build():
    paths = resolve_paths()
    installed_engine(paths, "old")
    installed_engine(paths, "new")
    update.activate(paths, "llama-server", "old", "new")
    assert config.load_settings(paths).engine_id == "new"
    started_s = time.monotonic()
    state = update.rollback(paths)
    assert time.monotonic() - started_s < 2
    assert (state.previous_id, state.current_id) == ("new", "old")
    assert config.load_settings(paths).engine_id == "old"
    assert update.rollback(paths).current_id == "new"  # a second rollback undoes the first


def test_rollback_without_an_update_or_without_the_old_build_is_refused():
    paths = resolve_paths()
    with pytest.raises(UsageError, match="no engine update to roll back"):
        update.rollback(paths)
    installed_engine(paths, "new")
    update.activate(paths, "llama-server", "gone", "new")
    with pytest.raises(UsageError, match="gone is no longer installed"):
        update.rollback(paths)
    assert config.load_settings(paths).engine_id == "new"


def test_starts_are_counted_for_the_activated_build_only():
    paths = resolve_paths()
    update.activate(paths, "llama-server", "old", "new")
    update.count_start(paths, "old")
    update.count_start(paths, "new")
    state = update.count_start(paths, "new")
    assert state is not None and state.starts == 2


def test_the_automatic_rollback_is_recorded_with_its_reason():
    paths = resolve_paths()
    installed_engine(paths, "old")
    installed_engine(paths, "new")
    update.activate(paths, "llama-server", "old", "new")
    assert update.roll_back_after_give_up(paths, "new", "illegal-instruction") is None
    assert config.load_settings(paths).engine_id == "new"
    why = update.roll_back_after_give_up(paths, "new", "exit-139")
    assert why is not None and "exit-139" in why
    assert config.load_settings(paths).engine_id == "old"
    state = updatestate.read_state(paths)
    assert state is not None and state.auto_rollback is not None
    assert (state.auto_rollback.from_id, state.auto_rollback.to_id) == ("new", "old")
    assert state.to_json()["auto_rollback"]["code"] == "exit-139"
    # the build it went back to is not rolled back again by its own crashes
    assert update.roll_back_after_give_up(paths, "old", "exit-139") is None


def test_the_state_file_is_written_whole(tmp_path: Path):
    paths = resolve_paths()
    update.activate(paths, "llama-server", "old", "new")
    assert [p.name for p in paths.state_dir.iterdir() if p.name.startswith(".")] == []
    assert updatestate.read_state(paths) == UpdateState(
        "llama-server",
        "old",
        "new",
        updatestate.read_state(paths).switched_at,  # type: ignore[union-attr]
    )


def test_a_build_from_an_older_known_source_has_a_newer_one():
    table = kinds.LLAMA_SERVER.known
    older, newest = table.by_version("b11401"), table.newest
    assert older is not None and older is not newest
    paths = resolve_paths()
    installed_engine(paths, "old-src", older.identity)
    installed_engine(paths, "new-src", newest.identity)
    engines = {e.id: e for e in list_engines(paths)}
    assert kinds.newer_known(engines["old-src"]) is newest
    assert kinds.newer_known(engines["new-src"]) is None
    assert kinds.newer_known(installed_manifest(paths, "added")) is None


def installed_manifest(paths: Paths, engine_id: str) -> EngineManifest:
    installed_engine(paths, engine_id)
    found = update.installed(paths, engine_id)
    assert found is not None
    return found


def test_an_update_uses_an_installed_build_of_the_newest_source_made_with_the_same_options():
    from lucebox.engine.engines import cputarget

    paths = resolve_paths()
    newest = kinds.LLAMA_SERVER.known.newest
    older = next(k for k in kinds.LLAMA_SERVER.known.sources if k is not newest)
    installed_engine(paths, "current", older.identity)
    installed_engine(paths, "other-baseline", newest.identity, options={"cpu_target": "x86-64"})
    current = update.installed(paths, "current")
    assert current is not None
    options = current.build_options(cputarget.NATIVE)
    assert update.installed_build_of(paths, "llama-server", newest, options) is None
    installed_engine(paths, "same-key", newest.identity)
    found = update.installed_build_of(paths, "llama-server", newest, options)
    assert found is not None and found.id == "same-key"
    assert update.installed_build_of(paths, "lucebox", newest, options) is None
