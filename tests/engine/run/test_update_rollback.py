"""The automatic rollback wired where the supervisor gives up: a new build (a fake engine that
always exits) that crash-loops after `engine update` is rolled back by itself."""

from __future__ import annotations

import sys

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.run.supervision.restartpolicy import RestartPolicy
from tests.engine.run.test_supervisor import _prepared_on


async def test_a_new_build_that_crash_loops_after_an_update_is_rolled_back_by_itself(tmp_path):
    from lucebox.engine import runstart
    from lucebox.engine.engines import update, updatestate
    from lucebox.engine.machine import config
    from tests.engine.engines.test_update import installed_engine

    paths = resolve_paths()
    installed_engine(paths, "old")
    crashing = f"#!{sys.executable}\nimport sys\nprint('crash', flush=True)\nsys.exit(139)\n"
    fake = installed_engine(paths, "new", script=crashing)
    update.activate(paths, "llama-server", "old", "new")
    prepared = _prepared_on(tmp_path, fake, ctx=16384)
    supervisor = runstart.new_supervisor(paths, prepared)
    supervisor.policy = RestartPolicy(max_crashes=2, first_backoff_s=0.01)
    events = [e async for e in supervisor.events()]
    assert events[-1].kind == "gave-up"
    assert "new crash-looped (exit-139)" in events[-1].message
    assert config.load_settings(paths).engine_id == "old"
    state = updatestate.read_state(paths)
    assert state is not None and state.auto_rollback is not None
    assert state.auto_rollback.code == "exit-139"
