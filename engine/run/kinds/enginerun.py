"""How a running engine of each kind is read: the parser of its log, its sampler, its warm-up.

One object per engine kind (:mod:`lucebox.engine.engines.kinds` names them); the supervisor and
the server run ask ``engine_run(kind)`` instead of testing which engine they hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from lucebox.engine.engines import kinds
from lucebox.engine.engines.registry import KindName
from lucebox.engine.plan.launch import ServerLaunch
from lucebox.engine.run.kinds import luceboxrun
from lucebox.engine.run.kinds.enginelog import EngineLog
from lucebox.engine.run.kinds.luceboxrun import LuceboxLog, LuceboxSampler
from lucebox.engine.run.kinds.metrics import Sampler


class EngineRun(Protocol):
    @property
    def sends_warm_up(self) -> bool:
        """Whether :meth:`warm_up` sends requests (and the engine log says how they went)."""
        ...

    def engine_log(self) -> EngineLog:
        """A fresh reader of the engine's log lines."""
        ...

    def sampler(self, url: str, engine_pid: int, log: EngineLog, **options: Any) -> Sampler:
        """The live sampler over the engine's endpoints and ``log`` (from :meth:`engine_log`)."""
        ...

    async def warm_up(self, client: httpx.AsyncClient, url: str) -> str | None:
        """The requests sent before the engine counts as ready; what failed, or None."""
        ...

    @property
    def reads_key_file(self) -> bool:
        """Whether the engine checks the API key itself (the front then sends it the key)."""
        ...

    def parallel(self, server: ServerLaunch) -> int:
        """Requests the engine serves at once (the front's queue lets that many in)."""
        ...

    def reply_budget(self, server: ServerLaunch) -> int:
        """The most reply tokens a request gets: a client's larger limit is clamped to it."""
        ...

    @property
    def answers_chat_page(self) -> bool:
        """Whether the engine answers the chat page's own calls (``/props``, ``/slots``);
        False: the front answers them when it serves the page."""
        ...

    @property
    def wake_argv(self) -> tuple[str, ...]:
        """What a wake adds to the launch it starts again: the same launch already passed its
        warm-up in this run, so a warm-up the engine runs on its own is left out."""
        ...


@dataclass(frozen=True)
class LlamaServerRun:
    sends_warm_up: bool = False
    reads_key_file: bool = True
    answers_chat_page: bool = True
    wake_argv: tuple[str, ...] = ("--no-warmup",)
    """Its empty warm-up run reads every weight once (its first decode): on a wake the same
    binary and files passed it before, and the client's turn waits behind it."""

    def parallel(self, server: ServerLaunch) -> int:
        return server.plan.parallel

    def reply_budget(self, server: ServerLaunch) -> int:
        """The context: llama-server stops a reply where its slot's context ends."""
        return server.plan.ctx

    def engine_log(self) -> EngineLog:
        return EngineLog()

    def sampler(self, url: str, engine_pid: int, log: EngineLog, **options: Any) -> Sampler:
        return Sampler(url, engine_pid, log, **options)

    async def warm_up(self, client: httpx.AsyncClient, url: str) -> str | None:
        """Nothing: llama-server allocates everything at load."""
        return None


@dataclass(frozen=True)
class LuceboxRun:
    sends_warm_up: bool = True
    reads_key_file: bool = False
    answers_chat_page: bool = False
    wake_argv: tuple[str, ...] = ()

    def parallel(self, server: ServerLaunch) -> int:
        """One: a single worker thread at batch 1 (the engine's contract)."""
        return 1

    def reply_budget(self, server: ServerLaunch) -> int:
        """The ``--max-tokens`` it was started with: above it the engine would refuse a prompt
        that leaves less room than the request asked for."""
        return server.lucebox.max_tokens if server.lucebox is not None else server.plan.ctx

    def engine_log(self) -> EngineLog:
        return LuceboxLog()

    def sampler(self, url: str, engine_pid: int, log: EngineLog, **options: Any) -> Sampler:
        if not isinstance(log, LuceboxLog):
            raise TypeError("the Lucebox engine's sampler reads the log its engine_log made")
        return LuceboxSampler(url, engine_pid, log, **options)

    async def warm_up(self, client: httpx.AsyncClient, url: str) -> str | None:
        """The Lucebox engine allocates its rollback buffers on the first request: one is sent
        before it counts as ready, so an out-of-memory abort comes now, not to a user."""
        return await luceboxrun.warm_up(client, url)


_RUNS: dict[KindName, EngineRun] = {
    kinds.LLAMA_SERVER.name: LlamaServerRun(),
    kinds.LUCEBOX.name: LuceboxRun(),
}


def engine_run(kind: KindName) -> EngineRun:
    return _RUNS[kind]
