"""HTTP/1.1 on lucebox's own listening sockets (h11 over asyncio streams), shared by the front
of a single engine (:mod:`front`) and the served set's proxy (:mod:`servedsetproxy`).

h11 is already a dependency (httpx's own HTTP/1.1), keeps connections alive for clients that
ask, frames a reply of unknown length as chunked, and leaves every byte of the reply to us: the
front must write SSE comments between an engine's events, which a full framework hides.

:class:`Exchange` is one request on one client connection; it watches the socket while the
request waits or runs, so a client that hangs up is seen at once (its request is then dropped
from the queue or its engine connection closed, which stops the engine's work).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol
from urllib.parse import urlsplit

import h11

from lucebox.engine.run.front.bodyguard import MAX_BODY_BYTES, too_large
from lucebox.engine.run.front.connguard import BODY_S, IDLE_S, WRITE_STALL_S, AddressCount
from lucebox.engine.run.front.frontguard import Refusal

HOP_HEADERS = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"host"}
READ_BYTES = 65536
KEEPALIVE_S = 5.0
"""Longest silence on a streamed reply before the front (or a set's proxy) writes a comment:
coding agents' watchdogs give up on a quiet stream."""
KEEPALIVE_COMMENT = b": keep-alive\n\n"
SSE_EVENT_END = re.compile(rb"\r?\n\r?\n")
LAST_EVENT = re.compile(
    rb"^data:\s*\[DONE\]"
    rb"|^event:\s*(message_stop|response\.(completed|incomplete|failed))\s*$"
    rb'|"type"\s*:\s*"(message_stop|response\.(completed|incomplete|failed))"',
    re.MULTILINE,
)
"""What ends a stream: [DONE] a chat one, message_stop an Anthropic one, the response's end a
Responses one."""
CARRIES_TOKEN = re.compile(
    rb'"(?:content|text|reasoning_content|thinking|partial_json|arguments|delta)"\s*:\s*"(?:[^"\\]|\\.)'
)
"""An event that carries generated text: a non-empty content or reasoning delta (chat), text
(completions), tool-call arguments, a text, thinking or tool-input delta (Anthropic), an output
delta (Responses).
A role, an empty content or a stream's start carries none."""
REPORTED_TOKENS = re.compile(rb'"(?:completion_tokens|output_tokens|predicted_n)"\s*:\s*(\d+)')
"""The reply's own count of what it generated: OpenAI's and Anthropic's usage, llama-server's
timings."""


DRAFT_COUNTS = re.compile(rb'"(draft_n|draft_n_accepted)"\s*:\s*(\d+)')
"""llama-server's timings of a reply it drafted for: tokens drafted and accepted (present only
when it drafted)."""


class ReplyTokens:
    """The tokens an answer carried: what the reply itself reports where it does (usage,
    timings), else the events that carried generated text (a stream without usage); and the
    draft tokens its timings say were drafted and accepted."""

    def __init__(self) -> None:
        self.reported = 0
        self.events = 0
        self.drafted = 0
        self.accepted = 0
        self.greedy: bool | None = None
        """Whether the request was decoded greedily; None: not a generation request."""

    def see(self, data: bytes) -> None:
        for found in REPORTED_TOKENS.finditer(data):
            self.reported = max(self.reported, int(found.group(1)))
        self.events += len(CARRIES_TOKEN.findall(data))
        for name, count in DRAFT_COUNTS.findall(data):
            if name == b"draft_n":
                self.drafted = max(self.drafted, int(count))
            else:
                self.accepted = max(self.accepted, int(count))

    @property
    def tokens(self) -> int:
        return self.reported or self.events


class EventShape(Protocol):
    """Shapes one streamed reply, event by event (it may hold one back, owed at the end)."""

    def feed(self, event: bytes) -> bytes:
        """One whole SSE event (ending in its blank line) in; what is sent on, maybe none."""
        ...

    def close(self) -> bytes:
        """What is still owed when the engine's stream ends."""
        ...


class ApiShape(Protocol):
    """The one place a request body and each reply or stream event pass through on their way
    between a client and the engine (the API normalizations: run/front/apishape.py)."""

    def request(self, path: str, body: bytes) -> bytes:
        """The body the engine gets for a client's request to ``path``."""
        ...

    def unsupported(self, path: str, body: bytes) -> str | None:
        """Why the engine cannot serve this request as asked (answered 400); None: it can."""
        ...

    def reply(self, path: str, status: int, body: bytes) -> bytes:
        """The body the client gets for a whole (not streamed) JSON reply."""
        ...

    def stream(self, path: str, request: bytes) -> EventShape:
        """The shape of one streamed reply to ``request``."""
        ...


class SameEvents:
    """Passes every event on unchanged."""

    def feed(self, event: bytes) -> bytes:
        return event

    def close(self) -> bytes:
        return b""


class SameShape:
    """Passes everything on unchanged."""

    def request(self, path: str, body: bytes) -> bytes:
        return body

    def unsupported(self, path: str, body: bytes) -> str | None:
        return None

    def reply(self, path: str, status: int, body: bytes) -> bytes:
        return body

    def stream(self, path: str, request: bytes) -> EventShape:
        return SameEvents()


class ClientGoneError(Exception):
    """The client closed its connection before its answer was complete."""


def error_body(status: int, message: str, kind: str = "lucebox_error") -> bytes:
    """An answer of lucebox's own, in the shape of the engines' errors."""
    return json.dumps({"error": {"code": status, "message": message, "type": kind}}).encode()


def split_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """The whole SSE events at the start of ``buffer`` (each with its blank line) and the rest."""
    events = []
    start = 0
    for end in SSE_EVENT_END.finditer(buffer):
        events.append(buffer[start : end.end()])
        start = end.end()
    return events, buffer[start:]


class Exchange:
    """One request of a client connection and the writing of its answer."""

    def __init__(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        arrived_s: float | None = None,
    ) -> None:
        self.conn = conn
        self.reader = reader
        self.writer = writer
        self.arrived_s = time.monotonic() if arrived_s is None else arrived_s
        """When the request's head arrived (monotonic): a client's wait counts from it."""
        self.started = False
        """The status line and headers are written."""
        self.gone = asyncio.Event()
        self._watch: asyncio.Task[None] | None = None
        self.reply = ReplyTokens()
        """What the answer written so far carried, counted per key."""

    def watch(self) -> None:
        """Notice a hang-up from now on (bytes a client sends meanwhile stay for h11)."""
        if self._watch is None:
            self._watch = asyncio.create_task(self._read_until_closed())

    async def _read_until_closed(self) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await self.reader.read(READ_BYTES):
                self.conn.receive_data(data)
        self.gone.set()

    async def unwatch(self) -> None:
        task, self._watch = self._watch, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def send(self, event: h11.Response | h11.Data | h11.EndOfMessage) -> None:
        if self.gone.is_set():
            raise ClientGoneError("the client hung up")
        data = self.conn.send(event)
        if isinstance(event, h11.Response):
            self.started = True
        if data:
            self.writer.write(data)
            try:
                await asyncio.wait_for(self.writer.drain(), WRITE_STALL_S)
            except ConnectionError as exc:
                raise ClientGoneError("the client hung up") from exc
            except TimeoutError as exc:
                self.gone.set()
                raise ClientGoneError("the client read nothing of its answer") from exc

    async def head(self, status: int, headers: Iterable[tuple[str | bytes, str | bytes]]) -> None:
        raw = [(_latin1(name), _latin1(value)) for name, value in headers]
        await self.send(h11.Response(status_code=status, headers=raw))

    async def data(self, data: bytes) -> None:
        if data:
            self.reply.see(data)
            await self.send(h11.Data(data=data))

    async def end(self) -> None:
        await self.send(h11.EndOfMessage())

    async def whole(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        extra: Iterable[tuple[str, str]] = (),
    ) -> None:
        """A complete answer with a known length."""
        headers = [("content-type", content_type), ("content-length", str(len(body))), *extra]
        await self.head(status, headers)
        await self.data(body)
        await self.end()

    async def error(self, status: int, message: str, extra: Iterable[tuple[str, str]] = ()) -> None:
        await self.whole(status, error_body(status, message), extra=extra)

    async def wait(self, awaitable: Awaitable[Any], timeout_s: float) -> bool:
        """Whether ``awaitable`` (a task) finished within ``timeout_s``; it keeps running
        otherwise. Raises ClientGoneError once the client has hung up."""
        task = asyncio.ensure_future(awaitable)
        gone = asyncio.ensure_future(self.gone.wait())
        try:
            await asyncio.wait({task, gone}, timeout=timeout_s, return_when="FIRST_COMPLETED")
        finally:
            gone.cancel()
        if task.done():
            return True
        if self.gone.is_set():
            raise ClientGoneError("the client hung up")
        return False


def _latin1(text: str | bytes) -> bytes:
    return text.encode("latin-1") if isinstance(text, str) else text


async def next_event(conn: h11.Connection, reader: asyncio.StreamReader) -> Any:
    while (event := conn.next_event()) is h11.NEED_DATA:
        conn.receive_data(await reader.read(READ_BYTES))
    return event


Answer = Callable[[Exchange, h11.Request, bytes], Awaitable[None]]


async def _read_body(
    conn: h11.Connection, reader: asyncio.StreamReader, request: h11.Request
) -> bytes | Refusal:
    """The request's body, or a refusal as soon as it is known to pass ``MAX_BODY_BYTES``: by
    its Content-Length, before a byte of it is read, else once what came passes it."""
    declared = dict(request.headers).get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return too_large(int(declared))
    body = bytearray()
    while isinstance(event := await next_event(conn, reader), h11.Data):
        body += event.data
        if len(body) > MAX_BODY_BYTES:
            return too_large(len(body))
    return bytes(body)


async def serve_connection(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    answer: Answer,
    addresses: AddressCount | None = None,
) -> None:
    """Answer each request of one client connection with ``answer`` until it closes (or stays
    silent, or sends too slowly: :mod:`connguard`); one connection too many from its address
    is answered 429. A connection still open when the server shuts down ends quietly (Python
    3.11's stream server prints a traceback for a connection task cancelled at shutdown)."""
    peer = writer.get_extra_info("peername")
    address = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
    admitted = addresses is None or addresses.enter(address)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            over = None if admitted or addresses is None else addresses.refusal(address)
            await _serve_connection(reader, writer, answer, over)
    finally:
        if admitted and addresses is not None:
            addresses.leave(address)


async def _serve_connection(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    answer: Answer,
    too_many: str | None = None,
) -> None:
    conn = h11.Connection(h11.SERVER)
    try:
        while True:
            request = await asyncio.wait_for(next_event(conn, reader), IDLE_S)
            if not isinstance(request, h11.Request):
                return
            arrived_s = time.monotonic()
            exchange = Exchange(conn, reader, writer, arrived_s)
            if too_many is not None:
                await exchange.error(429, too_many)
                return
            try:
                body = await asyncio.wait_for(_read_body(conn, reader, request), BODY_S)
            except TimeoutError:
                why = f"the request's body did not arrive within {BODY_S:.0f} s: send it at once"
                await exchange.error(408, why)
                return
            if isinstance(body, Refusal):  # answered before reading it all: the rest is not read
                await exchange.error(body.status, body.message)
                return
            try:
                await answer(exchange, request, body)
            finally:
                await exchange.unwatch()
            if exchange.gone.is_set():
                return
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()
    except (h11.ProtocolError, ConnectionError, ClientGoneError, TimeoutError):
        return
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


class EngineCall:
    """One request to the engine on a connection of its own: closing it is how a client's
    hang-up reaches the engine (llama-server and the Lucebox engine both stop generating when
    their client's socket closes)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.conn = h11.Connection(h11.CLIENT)
        self.ends_at_close = False
        self._unread: list[bytes] = []
        self._ended = False
        """The answer's body has been read to its end."""
        """The answer's body has no length and is not chunked: it ends when the engine
        closes the connection, so an engine that dies ends it the same way."""

    @classmethod
    async def open(cls, url: str) -> EngineCall:
        parts = urlsplit(url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
        return cls(reader, writer)

    async def send(
        self, method: str, target: str, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> h11.Response:
        """Write the request and read the engine's status line and headers."""
        sent = [
            (b"host", b"127.0.0.1"),
            (b"connection", b"close"),
            (b"content-length", str(len(body)).encode()),
            *headers,
        ]
        self.writer.write(self.conn.send(h11.Request(method=method, target=target, headers=sent)))
        self.writer.write(self.conn.send(h11.Data(data=body)) if body else b"")
        self.writer.write(self.conn.send(h11.EndOfMessage()))
        await self.writer.drain()
        event = await self._next()
        while isinstance(event, h11.InformationalResponse):
            event = await self._next()
        if not isinstance(event, h11.Response):
            raise ConnectionError("the engine closed the connection without an answer")
        framing = {k.lower() for k, _ in event.headers} & {b"content-length", b"transfer-encoding"}
        self.ends_at_close = not framing
        return event

    async def _next(self) -> Any:
        while (event := self.conn.next_event()) is h11.NEED_DATA:
            self.conn.receive_data(await self.reader.read(READ_BYTES))
        if isinstance(event, h11.ConnectionClosed):
            raise ConnectionError("the engine closed the connection mid-answer")
        return event

    def unread(self, data: bytes) -> None:
        """``data``, read from the answer's body already, comes again from :meth:`chunk`."""
        self._unread.append(data)

    async def chunk(self) -> bytes | None:
        """The next piece of the answer's body; None at its end."""
        if self._unread:
            return self._unread.pop(0)
        if self._ended:
            return None
        event = await self._next()
        if isinstance(event, h11.Data):
            return bytes(event.data)
        self._ended = True
        return None

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


def header_of(answer: h11.Response, name: bytes) -> str:
    """One header of the engine's answer ('' when absent)."""
    found = (v for k, v in answer.headers if k.lower() == name)
    return next(found, b"").decode("latin-1")


async def next_chunk(
    ex: Exchange,
    call: EngineCall,
    wait_s: float,
    on_quiet: Callable[[], Awaitable[None]] | None = None,
) -> bytes | None:
    """The engine's next piece of its answer (None at its end), looking every ``wait_s`` for a
    client that hung up (ClientGoneError) and calling ``on_quiet`` meanwhile."""
    reading = asyncio.ensure_future(call.chunk())
    try:
        while not await ex.wait(reading, wait_s):
            if on_quiet is not None:
                await on_quiet()
        return reading.result()
    finally:
        reading.cancel()


async def read_whole(ex: Exchange, call: EngineCall, wait_s: float) -> bytes:
    """The whole body of the engine's answer (a hang-up meanwhile ends the wait)."""
    whole = bytearray()
    while (chunk := await next_chunk(ex, call, wait_s)) is not None:
        whole += chunk
    return bytes(whole)
