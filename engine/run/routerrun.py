"""A served set's run: the router supervised like a single server, its models watched.

The router has no ``/slots`` and wants ``?model=`` on ``/metrics``, so the single server's
sampler does not apply; instead the run asks ``/models`` once a second and keeps each
model's state, memory and last use in the state file that `lucebox status` reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import httpx
import psutil

from lucebox.engine.core.api import auth_headers
from lucebox.engine.core.paths import Paths
from lucebox.engine.run.servedmodels import (
    ModelStateName,
    ModelStatus,
    proxied_model,
    router_states,
)
from lucebox.engine.run.serverrun import ServerRun

if TYPE_CHECKING:
    from lucebox.engine.run.sample import Sample
    from lucebox.engine.run.supervisor import ServerEvent, Supervisor

POLL_S = 1.0


@dataclass(frozen=True)
class PlannedModel:
    """What the set's plan says of one model: where it runs and what it may use."""

    alias: str
    device: str
    model_path: str
    planned_bytes: int
    on_gpu: bool


def child_memory_bytes(router_pid: int) -> dict[str, int]:
    """Resident memory of each of the router's model processes, by the model path they run."""
    found: dict[str, int] = {}
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(router_pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                argv = child.cmdline()
                for flag in ("-m", "--model"):
                    if flag in argv[:-1]:
                        found[argv[argv.index(flag) + 1]] = child.memory_info().rss
    return found


def model_statuses(
    planned: tuple[PlannedModel, ...],
    states: dict[str, ModelStateName],
    memory: dict[str, int],
    last_used: dict[str, float],
    now_s: float,
) -> tuple[ModelStatus, ...]:
    """Each planned model's status from the router's states and its processes (pure)."""
    statuses = []
    for model in planned:
        state = states.get(model.alias, "unloaded")
        running = state in ("loaded", "loading", "sleeping")
        held = memory.get(model.model_path, 0) if running else 0
        if model.on_gpu and state in ("loaded", "loading"):
            held = model.planned_bytes  # the card's share is the plan's; NVML has no per-child view
        used = last_used.get(model.alias)
        statuses.append(
            ModelStatus(
                alias=model.alias,
                state=state,
                device=model.device,
                memory_bytes=held,
                last_used_s=round(now_s - used, 1) if used is not None else None,
                planned_bytes=model.planned_bytes,
            )
        )
    return tuple(statuses)


class RouterRun(ServerRun):
    """The router's run: supervision, stop and restart as a single server's; models watched."""

    def __init__(
        self,
        paths: Paths,
        supervisor: Supervisor,
        *,
        planned: tuple[PlannedModel, ...],
        public_url: str,
        api_key: str | None = None,
    ) -> None:
        aliases = ", ".join(m.alias for m in planned)
        super().__init__(paths, supervisor, model=aliases, gpu_index=0, api_key=api_key)
        self.planned = planned
        self._last_used: dict[str, float] = {}
        self._run.status = replace(
            self._run.status,
            url=public_url,
            models=model_statuses(planned, {}, {}, {}, time.time()),
        )

    @property
    def served_aliases(self) -> tuple[str, ...]:
        return tuple(m.alias for m in self.planned)

    def _feed_line(self, engine_pid: int, line: str) -> None:
        super()._feed_line(engine_pid, line)
        name = proxied_model(line)
        if name is not None:
            self._last_used[name] = time.time()

    async def _sample(
        self, engine_pid: int, queue: asyncio.Queue[ServerEvent | Sample | None]
    ) -> None:
        async with httpx.AsyncClient(timeout=5.0, headers=auth_headers(self.api_key)) as client:
            while True:
                states: dict[str, ModelStateName] = {}
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    answer = await client.get(self.url + "/models")
                    states = router_states(answer.json())
                memory = await asyncio.to_thread(child_memory_bytes, engine_pid)
                models = model_statuses(self.planned, states, memory, self._last_used, time.time())
                self._run.status = replace(self._run.status, models=models)
                self._save()
                await asyncio.sleep(POLL_S)
