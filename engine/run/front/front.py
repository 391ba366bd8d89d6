"""lucebox's front door: the one HTTP server clients reach, whichever engine serves behind it.

It listens on the user's address and port; the engine listens on a private loopback port the
planner chose (``ServerLaunch.engine_port``). Every request passes the guard
(:mod:`frontguard`: the API key, ``Host`` and ``Origin``); a generation request then waits its
turn in :mod:`frontqueue` (the Lucebox engine serves one at a time, llama-server its slots), and
is relayed to the engine with the user's key replaced by the engine's own. While a streamed
request waits or the engine has sent nothing for a few seconds (a long prefill, a tool call
being built), the front writes SSE comment lines, valid on OpenAI, Anthropic and Responses
streams, so clients' idle watchdogs never fire. A client that hangs up leaves the queue, or has
its engine connection closed, which stops the engine's generation.

``/metrics`` (Prometheus text) and ``/v1/models`` (with ``context_length``) are answered from
lucebox's own numbers, the same on both engines. Request bodies, whole replies and stream
events pass through one :class:`~lucebox.engine.run.front.frontwire.ApiShape` (identity by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import h11

from lucebox.engine.run.front.apishape import SHAPED_PATHS, api_endpoint, models_with_context
from lucebox.engine.run.front.bodyguard import body_refusal
from lucebox.engine.run.front.chatpage import PageFacts, page_answer
from lucebox.engine.run.front.codexmodels import CodexModel, asks_codex_list, codex_models
from lucebox.engine.run.front.connguard import AddressCount
from lucebox.engine.run.front.enginegate import EngineGate
from lucebox.engine.run.front.frontcounters import FrontCounters, counters_text
from lucebox.engine.run.front.frontguard import (
    Refusal,
    admit,
    cors_headers,
    header_map,
    is_generation,
)
from lucebox.engine.run.front.frontqueue import (
    FrontQueue,
    QueueFullError,
    Ticket,
)
from lucebox.engine.run.front.frontwire import (
    CARRIES_TOKEN,
    HOP_HEADERS,
    LAST_EVENT,
    ApiShape,
    ClientGoneError,
    EngineCall,
    Exchange,
    SameShape,
    header_of,
    next_chunk,
    read_whole,
    serve_connection,
    split_events,
)
from lucebox.engine.run.front.keyuse import KeyTally
from lucebox.engine.run.front.ownreply import failed, keepalive, sse_started, stopped_midway
from lucebox.engine.run.front.prometheus import prometheus_text
from lucebox.engine.run.front.replycap import within_room
from lucebox.engine.run.front.samplingmix import SamplingMix
from lucebox.engine.run.front.sideroute import (
    CALL_ERRORS,
    NOT_RELAYED,
    relay_side,
    side_listing,
)
from lucebox.engine.run.runstate import Status
from lucebox.engine.run.sample import QueueStatus
from lucebox.engine.run.slots import ClientPrompt, kept_prompt

if TYPE_CHECKING:
    from lucebox.engine.plan.samplingdefaults import SamplingDefaults
    from lucebox.engine.run.front.frontsetup import FrontSetup

_ENGINE_ANSWER_DROPPED = HOP_HEADERS | {b"server", b"date"}
ENGINE_ERRORS = CALL_ERRORS
"""What a broken or refused connection to the engine raises."""
RELAY_ATTEMPTS = 2
"""A generation whose engine died before answering its first byte is sent once more to the
engine started again (nothing reached the client; a prompt that kills the engine dies twice
and is answered 502)."""
ENGINE_GONE_GRACE_S = 3.0
"""How long after a broken engine connection the run has to mark the engine down before the
front answers 502 (it learns of the death from the supervisor, a moment later)."""


def wants_stream(body: bytes) -> bool:
    if b'"stream"' not in body:
        return False
    with contextlib.suppress(ValueError, UnicodeDecodeError, RecursionError):
        data = json.loads(body)
        return isinstance(data, dict) and data.get("stream") is True
    return False


class Front:
    """Answers every client connection; see the module docstring."""

    def __init__(
        self,
        spec: FrontSetup,
        engine_url: Callable[[], str],
        *,
        status: Callable[[], Status] = lambda: Status("ready"),
        shape: ApiShape | None = None,
        sampling: SamplingDefaults | None = None,
    ) -> None:
        self.spec = spec
        self.engine_url = engine_url
        """Read per request: a re-planned engine may listen on another port."""
        self.status = status
        """The run's status now (its sample, speculation, cache) for ``/metrics``."""
        self.shape: ApiShape = shape or SameShape()
        self.queue = FrontQueue(spec.capacity, spec.max_waiting)
        self.counters = FrontCounters()
        self.key_use = KeyTally()
        self.sampling = SamplingMix(sampling)
        self.addresses = AddressCount()
        """Open connections by client address (:mod:`connguard`)."""
        self._page_facts = PageFacts(spec.model, spec.ctx, spec.images, sampling)
        """The sampling the generation requests got (``sampling``: what fills unset fields)."""
        # Read through the front: a test replaces its status.
        self.gate = EngineGate(lambda: self.status())
        self._engine_headers: list[tuple[bytes, bytes]] = (
            [(b"authorization", f"Bearer {spec.engine_key}".encode())] if spec.engine_key else []
        )
        self.client_prompt: ClientPrompt | None = None
        """The last generation request relayed to the engine: the slot holds its conversation
        (the run seats and saves it before a stop or lucebox's own request)."""
        self.on_request: Callable[[str, str], None] | None = None
        """Told each admitted request's method and path (the sleep watch wakes the engine)."""

    def _body_refusal(self, path: str, body: bytes) -> Refusal | None:
        return body_refusal(body, path, images=self.spec.images)

    def queue_status(self) -> QueueStatus:
        return self.queue.status()

    def engine_ready(self, ready: bool) -> None:
        """Whether the engine behind takes requests now; while not, generation requests wait
        (the run says so as its engine starts, stops and comes back)."""
        self.gate.engine_ready(ready)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_connection(reader, writer, self.answer, self.addresses)

    async def answer(self, ex: Exchange, request: h11.Request, body: bytes) -> None:
        method = request.method.decode("latin-1")
        target = request.target.decode("latin-1")
        path = urlsplit(target).path
        headers = header_map(request.headers)
        caller = admit(self.spec.policy, method, path, headers)
        if isinstance(caller, Refusal):
            self.counters.answered[caller.status] += 1
            await ex.error(caller.status, caller.message)
            return
        try:
            await self._answer_admitted(
                ex, request, body, method, target, path, headers, caller.key_name
            )
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            # A body shape no rule foresaw: the client hears it as an error, and the front
            # keeps serving (a dropped connection tells it nothing).
            if ex.started:
                raise
            self.counters.answered[500] += 1
            await ex.error(500, f"lucebox's front could not handle this request: {exc!r}")
        finally:
            self.key_use.count(caller.key_name, ex.reply.tokens)
            self.sampling.replied(ex.reply.greedy, ex.reply.drafted, ex.reply.accepted)

    async def _answer_admitted(
        self,
        ex: Exchange,
        request: h11.Request,
        body: bytes,
        method: str,
        target: str,
        path: str,
        headers: dict[str, str],
        key_name: str | None = None,
    ) -> None:
        cors = cors_headers(headers.get("origin"))
        if self.on_request is not None:
            self.on_request(method, path)
        ex.watch()
        try:
            if method == "OPTIONS":
                await ex.head(204, cors)
                await ex.end()
            elif method == "GET" and path == "/metrics":
                await ex.whole(200, self.metrics_text().encode(), "text/plain; version=0.0.4")
            elif method == "GET" and path in ("/v1/models", "/models"):
                await self._models(ex, cors, codex=asks_codex_list(target))
            elif route := next((r for r in self.spec.sides if r.answers(method, path)), None):
                wait_s = self.spec.keepalive_s
                status = await relay_side(ex, request, target, body, route, cors, wait_s)
                self.counters.answered[status] += 1
            elif page := page_answer(self.spec.page, method, path, self._page_facts):
                await ex.whole(200, page[0], page[1], extra=cors)
            elif is_generation(method, path) and (bad := self._body_refusal(path, body)):
                self.counters.answered[bad.status] += 1
                await ex.error(bad.status, bad.message, cors)
            elif is_generation(method, path) and (why := self.shape.unsupported(path, body)):
                self.counters.answered[400] += 1
                await ex.error(400, why, cors)
            elif is_generation(method, path):
                await self._queued(ex, request, target, path, body, cors, key_name)
            elif not self.gate.is_open and self.status().state == "sleeping":
                await self._asleep(ex, request, target, path, body, cors)
            elif not self.gate.is_open:
                self.counters.answered[503] += 1
                await self.gate.answer_closed(ex, cors)
            else:
                await self._relay(ex, request, target, path, body, cors, streamed=False)
        except ClientGoneError:
            self.counters.client_gone += 1
            ex.gone.set()

    async def _queued(
        self,
        ex: Exchange,
        request: h11.Request,
        target: str,
        path: str,
        body: bytes,
        cors: list[tuple[str, str]],
        key_name: str | None = None,
    ) -> None:
        streamed = wants_stream(body)
        try:
            ticket = self.queue.enter(ex.arrived_s, key_name)
        except QueueFullError as full:
            self.counters.answered[503] += 1
            retry = [("retry-after", str(full.retry_after_s))]
            await ex.error(503, f"the server is busy: {full}", [*retry, *cors])
            return
        ex.reply.greedy = self.sampling.record(body)  # unset fields as the shape fills them
        admitted = asyncio.ensure_future(ticket.admitted.wait())
        try:
            # A stream that must wait hears its place at once, then every queue_note_s.
            waits = streamed and not ticket.admitted.is_set()
            while waits or not await ex.wait(admitted, self.spec.queue_note_s):
                waits = False
                if streamed:
                    await sse_started(ex, cors)
                    await ex.data(f": queued, position {self.queue.position(ticket)}\n\n".encode())
            for attempt in range(1, RELAY_ATTEMPTS + 1):
                if not await self._engine_back(ex, cors, ticket.arrived_s, streamed=streamed):
                    return
                self.queue.serving(ticket)
                failure = await self._relay(
                    ex, request, target, path, body, cors,
                    streamed=streamed, may_retry=attempt < RELAY_ATTEMPTS, ticket=ticket,
                )  # fmt: skip
                if failure is None:
                    return
                if not await self.gate.closes_within(ENGINE_GONE_GRACE_S):
                    await failed(ex, self.counters, 502, failure)
                    return
                self.queue.held(ticket)  # waits for the engine again, as status says
        finally:
            admitted.cancel()
            self.queue.leave(ticket)

    async def _engine_back(
        self, ex: Exchange, cors: list[tuple[str, str]], arrived_s: float, *, streamed: bool
    ) -> bool:
        """Wait at the gate (a stream hears keep-alives); False once answered 503 instead."""

        async def quiet() -> None:
            await sse_started(ex, cors)
            await keepalive(ex, self.counters)

        spec = self.spec
        state = await self.gate.opened(
            ex, arrived_s, spec.engine_wait_s, spec.keepalive_s, quiet if streamed else None
        )
        if state is None:
            return True
        message = f"the engine is not serving ({state}); try again later"
        await failed(ex, self.counters, 503, message)
        return False

    async def _relay(
        self,
        ex: Exchange,
        request: h11.Request,
        target: str,
        path: str,
        body: bytes,
        cors: list[tuple[str, str]],
        *,
        streamed: bool,
        may_retry: bool = False,
        ticket: Ticket | None = None,
    ) -> str | None:
        """The request to the engine and its answer back; for a streamed request, comments
        while the engine says nothing. With ``may_retry``, an engine that failed before
        answering is not answered 502: what failed is returned, to send the request again."""
        sent = self.shape.request(path, body) if body else body
        headers: list[tuple[bytes, bytes]] = [
            *((k, v) for k, v in request.headers if k.lower() not in NOT_RELAYED),
            *self._engine_headers,
        ]
        method = request.method.decode("latin-1")
        if is_generation(method, path):
            now_prompt = ClientPrompt(path, sent, time.monotonic())
            self.client_prompt = kept_prompt(self.client_prompt, now_prompt, self.queue.capacity)
        sending = asyncio.ensure_future(self._call(method, target, headers, sent))
        try:
            while not await ex.wait(sending, self.spec.keepalive_s):
                if streamed:
                    await sse_started(ex, cors)
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
            await self._answer_back(ex, call, answer, path, body, cors, ticket)
        except ENGINE_ERRORS:
            ex.gone.set()  # the engine broke off: close the client's connection, not end it
        finally:
            await call.close()
        return None

    async def _asleep(
        self,
        ex: Exchange,
        request: h11.Request,
        target: str,
        path: str,
        body: bytes,
        cors: list[tuple[str, str]],
    ) -> None:
        """While the engine sleeps: a health check hears the server is healthy (it causes no
        wake, so it must not wait for one); any other request has woken it (``on_request``)
        and waits for it, as a generation request does."""
        if path in ("/health", "/v1/health"):
            self.counters.answered[200] += 1
            await ex.whole(200, b'{"status":"ok"}', extra=cors)
        elif await self._engine_back(ex, cors, ex.arrived_s, streamed=False):
            await self._relay(ex, request, target, path, body, cors, streamed=False)

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
        return await self._call(method, target, headers, shorter)

    async def _call(
        self, method: str, target: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> tuple[EngineCall, h11.Response]:
        call = await EngineCall.open(self.engine_url())
        try:
            return call, await call.send(method, target, headers, body)
        except BaseException:
            call.writer.close()
            raise

    async def _answer_back(
        self,
        ex: Exchange,
        call: EngineCall,
        answer: h11.Response,
        path: str,
        body: bytes,
        cors: list[tuple[str, str]],
        ticket: Ticket | None,
    ) -> None:
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
                detail = (await self._read_all(ex, call)).decode("utf-8", errors="replace")
                await ex.data(f"event: error\ndata: {detail}\n\n".encode())
                await ex.end()
                return
            await self._pipe_events(ex, call, path, body, ticket, status)
            return
        if path == "/" and status >= 400:
            await ex.whole(200, self._index(), extra=cors)
            return
        kept = [
            (k, v)
            for k, v in answer.headers
            if k.lower() not in _ENGINE_ANSWER_DROPPED
            and not k.lower().startswith(b"access-control-")
        ]
        if "text/event-stream" in content_type:
            await ex.head(status, [*kept, *cors])
            await self._pipe_events(ex, call, path, body, ticket, status)
        elif "application/json" in content_type:
            whole = self.shape.reply(path, status, await self._read_all(ex, call))
            await ex.head(status, [*kept, ("content-length", str(len(whole))), *cors])
            await ex.data(whole)
            await ex.end()
        else:
            await ex.head(status, [*kept, *cors])
            while (chunk := await call.chunk()) is not None:
                await ex.data(chunk)
            await ex.end()

    async def _read_all(self, ex: Exchange, call: EngineCall) -> bytes:
        return await read_whole(ex, call, self.spec.keepalive_s)

    async def _next_chunk(self, ex: Exchange, call: EngineCall, *, quiet: bool) -> bytes | None:
        """The engine's next bytes; with ``quiet``, a comment whenever it is silent long."""
        comment = (lambda: keepalive(ex, self.counters)) if quiet else None
        return await next_chunk(ex, call, self.spec.keepalive_s, comment)

    async def _pipe_events(
        self,
        ex: Exchange,
        call: EngineCall,
        path: str,
        body: bytes,
        ticket: Ticket | None,
        status: int,
    ) -> None:
        """The engine's SSE events on, each through the shape; a comment whenever it is
        silent for ``keepalive_s`` between two events (never inside one). The answer counts
        as ``status`` once the stream ended whole, as 502 when it was cut."""
        shaper = self.shape.stream(path, body)
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

    async def _models(self, ex: Exchange, cors: list[tuple[str, str]], *, codex: bool) -> None:
        """The engine's model list with the context planned now
        (:func:`apishape.models_with_context`), or in Codex's shape where Codex asks
        (:func:`codexmodels.codex_models`); an engine that does not answer is said. An engine
        asleep is not woken: clients poll this, and the served alias is known."""
        listed: object = {}
        if self.status().state != "sleeping":
            try:
                call, _ = await self._call("GET", "/v1/models", self._engine_headers, b"")
                try:
                    listed = json.loads(await self._read_all(ex, call))
                finally:
                    await call.close()
            except (*ENGINE_ERRORS, ValueError) as exc:
                await failed(ex, self.counters, 502, f"the engine did not list its models: {exc}")
                return
        data = listed.get("data") if isinstance(listed, dict) else None
        ids = [m["id"] for m in data or () if isinstance(m, dict) and isinstance(m.get("id"), str)]
        served = dict.fromkeys(ids or [self.spec.model], self.spec.ctx)
        if codex:
            document = codex_models([self._codex_model(model_id) for model_id in served])
        else:
            document = models_with_context(listed, served, int(time.time()))
            document.setdefault("data", []).extend(side_listing(self.spec.sides, int(time.time())))
        self.counters.answered[200] += 1
        await ex.whole(200, json.dumps(document).encode(), extra=cors)

    def _codex_model(self, model_id: str) -> CodexModel:
        spec = self.spec
        return CodexModel(model_id, spec.ctx, spec.thinking_default, spec.images)

    def _index(self) -> bytes:
        """``GET /`` when the engine has no page there: what is served, and where."""
        return json.dumps(
            {
                "name": "lucebox",
                "model": self.spec.model,
                "context_length": self.spec.ctx,
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

    def metrics_text(self) -> str:
        """Prometheus text: the run's numbers with the queue as it is now, and the front's."""
        status = replace(self.status(), queue=self.queue.status())
        return prometheus_text(status) + counters_text(self.counters)


async def start_front(front: Front, host: str, port: int) -> asyncio.Server:
    """The front listening on ``host:port`` (IPv4 and IPv6 where the host name has both)."""
    return await asyncio.start_server(front.handle, host, port)
