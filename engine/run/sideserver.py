"""The embedding and reranker models' llama-server processes, beside the chat engine whichever
engine serves chat: each started as planned (``SideModel.argv``), on its own loopback port,
started again when it dies (with a growing wait), and stopped with the run.

The front sends ``/v1/embeddings`` and ``/v1/rerank`` straight to them (front/sideroute.py), never
through the chat queue: another process answers them, so they need not wait for a chat reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import httpx

from lucebox.engine.plan.lucebox.luceboxlaunch import ENGINE_ENV_PREFIXES
from lucebox.engine.plan.sidemodels import SideModel, SideRole
from lucebox.engine.run.front.sideroute import PATHS_OF, SideRoute
from lucebox.engine.run.sample import SideStatus
from lucebox.engine.run.supervision.engineprocess import die_with_parent

STOP_GRACE_S = 5.0
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
HEALTH_POLL_S = 0.25


def side_route(side: SideModel, key: str | None) -> SideRoute:
    return SideRoute(
        side.role,
        side.alias,
        f"http://127.0.0.1:{side.port}",
        PATHS_OF[side.role],
        key if side.api_key_file else None,
    )


def side_environ(side: SideModel, inherited: dict[str, str]) -> dict[str, str]:
    """This process's environment without engine settings that would change the launch
    behind the plan's back, on the chat model's first GPU (or none)."""
    kept = {
        name: value
        for name, value in inherited.items()
        if not name.startswith(("LLAMA_ARG_", *ENGINE_ENV_PREFIXES)) and name != "LLAMA_API_KEY"
    }
    kept["CUDA_VISIBLE_DEVICES"] = side.gpus
    return kept


class SideServers:
    """Runs every side model until :meth:`stop`; ``ready`` says which answer now."""

    def __init__(self, sides: tuple[SideModel, ...], logs_dir: Path) -> None:
        self.sides = sides
        self.logs_dir = logs_dir
        self.ready: dict[SideRole, bool] = {side.role: False for side in sides}
        self.restarts: dict[SideRole, int] = {side.role: 0 for side in sides}
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        self._stopping.set()

    def status(self) -> tuple[SideStatus, ...]:
        return tuple(
            SideStatus(s.role, s.alias, self.ready[s.role], self.restarts[s.role])
            for s in self.sides
        )

    async def run(self) -> None:
        await asyncio.gather(*(self._keep(side) for side in self.sides))

    async def _keep(self, side: SideModel) -> None:
        """``side`` started, and started again after each death, until the run stops."""
        wait_s = BACKOFF_FIRST_S
        while not self._stopping.is_set():
            await self._one(side)
            self.ready[side.role] = False
            if self._stopping.is_set():
                return
            self.restarts[side.role] += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), wait_s)
            wait_s = min(wait_s * 2, BACKOFF_MAX_S)

    async def _one(self, side: SideModel) -> None:
        log_path = self.logs_dir / f"{side.role}.log"
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            try:
                process = await asyncio.create_subprocess_exec(
                    *side.argv,
                    env=side_environ(side, dict(os.environ)),
                    stdout=log,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
            except OSError as exc:  # a build gone missing: said in its log, tried again later
                log.write(f"# lucebox: {side.argv[0]} did not start: {exc}\n".encode())
                return
        watching = asyncio.create_task(self._until_ready(side))
        stopping = asyncio.create_task(self._stopping.wait())
        exited = asyncio.create_task(process.wait())
        try:
            await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (watching, stopping):
                task.cancel()
            if process.returncode is None:
                process.terminate()
                try:
                    await asyncio.wait_for(exited, STOP_GRACE_S)
                except TimeoutError:
                    process.kill()
                    await exited

    async def _until_ready(self, side: SideModel) -> None:
        """``ready`` set once the side's /health answers 200."""
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    answer = await client.get(f"http://127.0.0.1:{side.port}/health")
                    if answer.status_code == 200:
                        self.ready[side.role] = True
                        return
                await asyncio.sleep(HEALTH_POLL_S)
