"""A request's relay to the engine and its answer back: the user's key replaced by the
engine's own, a reply limit too long for the prompt cut to fit (:mod:`replycap`), whole
replies and stream events through the :class:`~lucebox.engine.run.front.frontwire.ApiShape`,
and comments while the engine says nothing. The engine's stream is counted by how it ended:
whole, or cut (502, told to the client as the stream's last event)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from lucebox.engine.run.front.frontguard import is_generation
from lucebox.engine.run.front.frontwire import (
    CARRIES_TOKEN,
    HOP_HEADERS,
    LAST_EVENT,
    EngineCall,
    header_of,
    next_chunk,
    read_whole,
    split_events,
)
from lucebox.engine.run.front.ownreply import failed, keepalive, sse_started, stopped_midway
from lucebox.engine.run.front.replycap import within_room
from lucebox.engine.run.front.shapecontext import SHAPED_PATHS, api_endpoint
from lucebox.engine.run.front.sideroute import CALL_ERRORS, NOT_RELAYED
from lucebox.engine.run.slots import ClientPrompt, kept_prompt

if TYPE_CHECKING:
    from collections.abc import Callable

    import h11

    from lucebox.engine.run.front.frontcounters import FrontCounters
    from lucebox.engine.run.front.frontqueue import Ticket
    from lucebox.engine.run.front.frontsetup import FrontSetup
    from lucebox.engine.run.front.frontwire import ApiShape, Exchange

_ENGINE_ANSWER_DROPPED = HOP_HEADERS | {b"server", b"date"}
ENGINE_ERRORS = CALL_ERRORS
"""What a broken or refused connection to the engine raises."""


@dataclass(frozen=True)
class ClientRequest:
    """One admitted request of a client, as the front relays it, and the answer's writer."""

    ex: Exchange
    request: h11.Request
    target: str
    path: str
    body: bytes
    cors: list[tuple[str, str]]
    """The CORS headers its answer carries."""

    @property
    def method(self) -> str:
        return self.request.method.decode("latin-1")


class EngineRelay:
    """Sends requests to the engine behind one front and writes its answers back."""

    def __init__(
        self,
        engine_url: Callable[[], str],
        setup: Callable[[], FrontSetup],
        shape: ApiShape,
        counters: FrontCounters,
        capacity: int,
    ) -> None:
        self.engine_url = engine_url
        self._setup = setup
        """The front's setup now: a re-plan gives it another (its context, its waits)."""
        self.shape = shape
        self.counters = counters
        self._capacity = capacity
        engine_key = setup().engine_key
        self.engine_headers: list[tuple[bytes, bytes]] = (
            [(b"authorization", f"Bearer {engine_key}".encode())] if engine_key else []
        )
        self.client_prompt: ClientPrompt | None = None
        """The last generation request relayed to the engine: the slot holds its conversation
        (the run seats and saves it before a stop or lucebox's own request)."""

    async def relay(
        self,
        asked: ClientRequest,
        *,
        streamed: bool,
        may_retry: bool = False,
        ticket: Ticket | None = None,
    ) -> str | None:
        """The request to the engine and its answer back; for a streamed request, comments
        while the engine says nothing. With ``may_retry``, an engine that failed before
        answering is not answered 502: what failed is returned, to send the request again."""
        ex, path, target, method = asked.ex, asked.path, asked.target, asked.method
        sent = self.shape.request(path, asked.body) if asked.body else asked.body
        headers: list[tuple[bytes, bytes]] = [
            *((k, v) for k, v in asked.request.headers if k.lower() not in NOT_RELAYED),
            *self.engine_headers,
        ]
        if is_generation(method, path):
            now_prompt = ClientPrompt(path, sent, time.monotonic())
            self.client_prompt = kept_prompt(self.client_prompt, now_prompt, self._capacity)
        sending = asyncio.ensure_future(self.call(method, target, headers, sent))
        try:
            while not await ex.wait(sending, self._setup().keepalive_s):
                if streamed:
                    await sse_started(ex, asked.cors)
                    await keepalive(ex, self.counters)
            call, answer = sending.result()
            call, answer = await self._within_context(call, answer, method, target, headers, sent)
        except ENGINE_ERRORS as exc:
            failure = f"the engine did not answer: {exc}"
            if may_retry:
                return failure
            await failed(ex, self.counters, 502, failure)
            return None
        finally:
            sending.cancel()  # a client gone before the engine answered: the call closes
        try:
            await self._answer_back(asked, call, answer, ticket)
        except ENGINE_ERRORS:
            ex.gone.set()  # the engine broke off: close the client's connection, not end it
        finally:
            await call.close()
        return None

    async def call(
        self, method: str, target: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> tuple[EngineCall, h11.Response]:
        call = await EngineCall.open(self.engine_url())
        try:
            return call, await call.send(method, target, headers, body)
        except BaseException:
            call.writer.close()
            raise

    async def read_all(self, ex: Exchange, call: EngineCall) -> bytes:
        return await read_whole(ex, call, self._setup().keepalive_s)

    async def _within_context(
        self,
        call: EngineCall,
        answer: h11.Response,
        method: str,
        target: str,
        headers: list[tuple[bytes, bytes]],
        sent: bytes,
    ) -> tuple[EngineCall, h11.Response]:
        """A reply limit the engine refused as too long for this prompt is cut to the room
        the prompt leaves, and the request sent once more (:mod:`replycap`)."""
        path = urlsplit(target).path
        if answer.status_code != 400 or not is_generation(method, path):
            return call, answer
        refused = bytearray()
        while (chunk := await call.chunk()) is not None:
            refused += chunk
        shorter = within_room(sent, api_endpoint(path), bytes(refused))
        if shorter is None:
            call.unread(bytes(refused))
            return call, answer
        await call.close()
        self.client_prompt = ClientPrompt(path, shorter, time.monotonic())
        return await self.call(method, target, headers, shorter)

    async def _answer_back(
        self, asked: ClientRequest, call: EngineCall, answer: h11.Response, ticket: Ticket | None
    ) -> None:
        ex, path, cors = asked.ex, asked.path, asked.cors
        status = answer.status_code
        content_type = header_of(answer, b"content-type")
        streamed = ex.started or "text/event-stream" in content_type
        if not streamed:
            # A stream is counted once it ends, by how it ended (whole, or cut: 502); one the
            # client hangs up on counts among lucebox_client_disconnects_total instead.
            self.counters.answered[status] += 1
        if ex.started:  # our own SSE head is out: the engine's status goes in the stream
            if status != 200:
                self.counters.answered[status] += 1
                detail = (await self.read_all(ex, call)).decode("utf-8", errors="replace")
                await ex.data(f"event: error\ndata: {detail}\n\n".encode())
                await ex.end()
                return
            await self._pipe_events(asked, call, ticket, status)
            return
        if path == "/" and status >= 400:
            await ex.whole(200, index_page(self._setup()), extra=cors)
            return
        kept = [
            (k, v)
            for k, v in answer.headers
            if k.lower() not in _ENGINE_ANSWER_DROPPED
            and not k.lower().startswith(b"access-control-")
        ]
        if "text/event-stream" in content_type:
            await ex.head(status, [*kept, *cors])
            await self._pipe_events(asked, call, ticket, status)
        elif "application/json" in content_type:
            whole = self.shape.reply(path, status, await self.read_all(ex, call))
            await ex.head(status, [*kept, ("content-length", str(len(whole))), *cors])
            await ex.data(whole)
            await ex.end()
        else:
            await ex.head(status, [*kept, *cors])
            while (chunk := await call.chunk()) is not None:
                await ex.data(chunk)
            await ex.end()

    async def _next_chunk(self, ex: Exchange, call: EngineCall, *, quiet: bool) -> bytes | None:
        """The engine's next bytes; with ``quiet``, a comment whenever it is silent long."""
        comment = (lambda: keepalive(ex, self.counters)) if quiet else None
        return await next_chunk(ex, call, self._setup().keepalive_s, comment)

    async def _pipe_events(
        self, asked: ClientRequest, call: EngineCall, ticket: Ticket | None, status: int
    ) -> None:
        """The engine's SSE events on, each through the shape; a comment whenever it is
        silent for ``keepalive_s`` between two events (never inside one). The answer counts
        as ``status`` once the stream ended whole, as 502 when it was cut."""
        ex, path = asked.ex, asked.path
        shaper = self.shape.stream(path, asked.body)
        pending = b""
        ended = False
        try:
            while (chunk := await self._next_chunk(ex, call, quiet=not pending)) is not None:
                if ticket is not None:
                    ticket.engine_chunks += 1
                events, pending = split_events(pending + chunk)
                if (
                    ticket is not None
                    and ticket.first_token_s is None
                    and any(CARRIES_TOKEN.search(event) for event in events)
                ):
                    ticket.first_token_s = time.monotonic() - ticket.arrived_s
                # The Lucebox engine ends a stream by closing the connection, so its death in
                # the middle of one ends it the same way: only the last event tells them apart.
                if call.ends_at_close and not ended:
                    ended = any(LAST_EVENT.search(event) for event in events)
                await ex.data(b"".join(shaper.feed(e) for e in events))
        except ENGINE_ERRORS as exc:
            # The events so far are whole (a cut one is dropped): the client reads why it
            # ended instead of a connection closed under it.
            await failed(ex, self.counters, 502, stopped_midway(str(exc)))
            return
        ended = ended or LAST_EVENT.search(pending) is not None  # a last event cut short
        if call.ends_at_close and api_endpoint(path) in SHAPED_PATHS and not ended:
            cut = stopped_midway("its stream ended without its last event")
            await failed(ex, self.counters, 502, cut)
            return
        self.counters.answered[status] += 1
        await ex.data(shaper.close() + pending)
        await ex.end()


def index_page(setup: FrontSetup) -> bytes:
    """``GET /`` when the engine has no page there: what is served, and where."""
    return json.dumps(
        {
            "name": "lucebox",
            "model": setup.model,
            "context_length": setup.ctx,
            "endpoints": [
                "/v1/chat/completions",
                "/v1/messages",
                "/v1/responses",
                "/v1/models",
                "/metrics",
                "/health",
            ],
        }
    ).encode()
