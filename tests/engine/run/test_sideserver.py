"""Side model processes: started again after they die, and stopped with the run."""

from __future__ import annotations

import asyncio

from lucebox.engine.core.units import MIB
from lucebox.engine.plan.sidemodels import SideFile, SideHost, plan_sides
from lucebox.engine.run.sideserver import SideServers
from support.ports import free_port

FILE = SideFile("embeddings", "m.gguf", "/m.gguf", 10 * MIB, 512, 384, 12, 1536, 1)


def sides_running(server_path: str) -> tuple:
    host = SideHost(server_path, None, on_gpu=False, gpus="", engine_port=free_port())
    return plan_sides((FILE,), headroom_bytes=1 << 40, host=host).models


async def _run_for(servers: SideServers, seconds: float) -> None:
    running = asyncio.create_task(servers.run())
    await asyncio.sleep(seconds)
    servers.stop()
    await asyncio.wait_for(running, 10)


async def test_a_side_model_that_dies_is_started_again_and_its_log_kept(tmp_path):
    script = tmp_path / "dies.sh"
    script.write_text('#!/bin/sh\necho dying "$@"\nexit 1\n')
    script.chmod(0o755)
    servers = SideServers(sides_running(str(script)), tmp_path / "logs")
    await _run_for(servers, 2.5)
    assert servers.restarts["embeddings"] >= 1
    assert not servers.ready["embeddings"]
    assert "dying -m /m.gguf" in (tmp_path / "logs" / "embeddings.log").read_text()


async def test_a_missing_build_is_said_in_the_log_and_the_run_still_stops(tmp_path):
    servers = SideServers(sides_running(str(tmp_path / "gone")), tmp_path / "logs")
    await _run_for(servers, 0.5)
    assert "did not start" in (tmp_path / "logs" / "embeddings.log").read_text()
