"""How a running engine of each kind is read: the parser of its log, its sampler, its warm-up.

One object per engine kind (:mod:`lucebox.engine.engines.kinds` names them); the supervisor and
the server run ask ``engine_run(kind)`` instead of testing which engine they hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from lucebox.engine.core.api import auth_headers
from lucebox.engine.core.errors import LuceboxError
from lucebox.engine.engines import kinds
from lucebox.engine.engines.registry import KindName
from lucebox.engine.machine.apikey import read_api_key
from lucebox.engine.plan.launch import ServerLaunch
from lucebox.engine.run.kinds import luceboxrun
from lucebox.engine.run.kinds.enginelog import EngineLog
from lucebox.engine.run.kinds.luceboxrun import LuceboxLog, LuceboxSampler
from lucebox.engine.run.kinds.metrics import Sampler

WARM_UP_TIMEOUT_S = 300.0
LLAMA_WARM_UP_TOKENS = 8
LLAMA_WARM_UP_PROMPT = "Here is a short note to read before the first reply. " * 8
"""About a hundred tokens: the prompt is read as a batch, as a client's is, not token by token."""


class EngineRun(Protocol):
    def sends_warm_up(self, server: ServerLaunch, *, woken: bool) -> bool:
        """Whether :meth:`warm_up` sends requests before ``server`` counts as ready (and the
        engine log says how they went); ``woken``: the start is a wake's (:attr:`wake_argv`)."""
        ...

    def engine_log(self) -> EngineLog:
        """A fresh reader of the engine's log lines."""
        ...

    def sampler(self, url: str, engine_pid: int, log: EngineLog, **options: Any) -> Sampler:
        """The live sampler over the engine's endpoints and ``log`` (from :meth:`engine_log`)."""
        ...

    async def warm_up(
        self, client: httpx.AsyncClient, url: str, server: ServerLaunch
    ) -> str | None:
        """The requests sent to the engine at ``url`` before it counts as ready (when
        :meth:`sends_warm_up`); what failed, or None."""
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


async def _warm_up_request(
    client: httpx.AsyncClient, endpoint: str, body: dict[str, Any], headers: dict[str, str]
) -> str | None:
    """POST ``body`` to ``endpoint`` as a warm-up: None when the engine answered, else what
    went wrong."""
    try:
        reply = await client.post(endpoint, json=body, headers=headers, timeout=WARM_UP_TIMEOUT_S)
    except httpx.HTTPError as exc:
        return f"the warm-up request failed: {exc}"
    if reply.status_code != 200:
        return f"the warm-up request got HTTP {reply.status_code}: {reply.text[:200]}"
    return None


@dataclass(frozen=True)
class LlamaServerRun:
    reads_key_file: bool = True
    answers_chat_page: bool = True
    wake_argv: tuple[str, ...] = ("--no-warmup",)
    """Its empty warm-up run reads every weight once (its first decode): on a wake the same
    binary and files passed it before, and the client's turn waits behind it."""

    def sends_warm_up(self, server: ServerLaunch, *, woken: bool) -> bool:
        """A single model's start, not a wake's: the request that woke the engine waits behind
        any warm-up, so the first reply's one-time cost stays in that client's wait whichever
        request pays it, and the same launch passed the warm-up before it slept. A served set's
        router loads its models on demand and has none to warm."""
        return not server.router and not woken

    def parallel(self, server: ServerLaunch) -> int:
        return server.plan.parallel

    def reply_budget(self, server: ServerLaunch) -> int:
        """The context: llama-server stops a reply where its slot's context ends."""
        return server.plan.ctx

    def engine_log(self) -> EngineLog:
        return EngineLog()

    def sampler(self, url: str, engine_pid: int, log: EngineLog, **options: Any) -> Sampler:
        return Sampler(url, engine_pid, log, **options)

    async def warm_up(
        self, client: httpx.AsyncClient, url: str, server: ServerLaunch
    ) -> str | None:
        """A short greedy generation (through the draft or the MTP head too when speculation
        is on) before the engine counts as ready: llama-server allocates its memory at load
        and runs an empty batch itself (``--warmup``), yet the first reply after a launch
        decoded markedly slower than the later ones, a one-time cost that falls on this request
        instead of a client's (measured per engine by ``benchmarks/decode_spread_gpu.py``,
        ``benchmarks/results/h100-decode-spread-gpu.json``). It takes the slot a saved
        conversation is restored into after the engine says ready (serverrun.py)."""
        body = {
            "prompt": LLAMA_WARM_UP_PROMPT,
            "n_predict": LLAMA_WARM_UP_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
        }
        try:
            key = read_api_key(Path(server.api_key_file)) if server.api_key_file else None
        except LuceboxError as exc:
            return exc.message
        return await _warm_up_request(client, f"{url}/completion", body, auth_headers(key))


@dataclass(frozen=True)
class LuceboxRun:
    reads_key_file: bool = False
    answers_chat_page: bool = False
    wake_argv: tuple[str, ...] = ()

    def sends_warm_up(self, server: ServerLaunch, *, woken: bool) -> bool:
        """Every start, a wake's too: nothing the engine runs on its own warms it."""
        return True

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

    async def warm_up(
        self, client: httpx.AsyncClient, url: str, server: ServerLaunch
    ) -> str | None:
        """The Lucebox engine allocates its rollback buffers on the first request: one is sent
        before it counts as ready, so an out-of-memory abort comes now, not to a user."""
        endpoint = f"{url}/v1/chat/completions"
        return await _warm_up_request(client, endpoint, luceboxrun.warm_up_body(), {})


_RUNS: dict[KindName, EngineRun] = {
    kinds.LLAMA_SERVER.name: LlamaServerRun(),
    kinds.LUCEBOX.name: LuceboxRun(),
}


def engine_run(kind: KindName) -> EngineRun:
    return _RUNS[kind]
