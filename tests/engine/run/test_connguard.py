"""The front's bounds on one client connection (run/front/connguard.py), on real sockets: a
connection too many from one address hears 429, a silent one is closed, a body that trickles
hears 408, and an answer the client never reads ends its work."""

from __future__ import annotations

import asyncio
import contextlib

import h11
import pytest

from lucebox.engine.run.front import connguard, frontwire
from lucebox.engine.run.front.connguard import AddressCount
from lucebox.engine.run.front.frontwire import ClientGoneError, Exchange, serve_connection

REQUEST = b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n"


async def serving(answer, addresses=None):
    async def handle(reader, writer):
        await serve_connection(reader, writer, answer, addresses)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def pong(ex: Exchange, request: h11.Request, body: bytes) -> None:
    await ex.whole(200, b'{"pong":true}')


async def ask(port: int, raw: bytes = REQUEST) -> bytes:
    """The whole answer to ``raw``: up to its body's length, or until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    answer = b""
    while b"\r\n\r\n" not in answer or not _complete(answer):
        chunk = await asyncio.wait_for(reader.read(65536), 10)
        if not chunk:
            break
        answer += chunk
    await closed(writer)
    return answer


def _complete(answer: bytes) -> bool:
    head, _, body = answer.partition(b"\r\n\r\n")
    length = [line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")]
    return bool(length) and len(body) >= int(length[0].split(b":")[1])


async def closed(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def stop(server: asyncio.Server) -> None:
    server.close()
    await server.wait_closed()


async def test_one_connection_too_many_from_an_address_hears_429_naming_the_limit(
    monkeypatch: pytest.MonkeyPatch,
):
    # This PC's own programs are not bounded: the test's loopback stands for a LAN address.
    monkeypatch.setattr(connguard, "_loopback", lambda address: False)
    server, port = await serving(pong, AddressCount(limit=2))
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
    await asyncio.sleep(0.1)
    refused = await ask(port)
    assert refused.startswith(b"HTTP/1.1 429")
    assert b"more than 2 connections from 127.0.0.1 are open at once" in refused
    _, writer = held.pop()
    await closed(writer)
    await asyncio.sleep(0.1)
    assert (await ask(port)).startswith(b"HTTP/1.1 200")
    for _, writer in held:
        await closed(writer)
    await stop(server)


def test_this_pcs_own_programs_are_not_bounded():
    count = AddressCount(limit=1)
    assert all(count.enter("127.0.0.1") for _ in range(5)) and count.enter("::1")
    assert count.enter("192.168.1.20") and not count.enter("192.168.1.20")
    count.leave("192.168.1.20")
    assert count.enter("192.168.1.20")


async def test_a_silent_connection_is_closed(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(frontwire, "IDLE_S", 0.3)
    server, port = await serving(pong)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await asyncio.wait_for(reader.read(100), 5) == b""  # closed, nothing said
    await closed(writer)
    await stop(server)


async def test_a_body_that_trickles_hears_408(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(frontwire, "BODY_S", 0.3)
    server, port = await serving(pong)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{"
    answer = await ask(port, head)
    assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within" in answer
    await stop(server)


async def test_an_answer_the_client_never_reads_ends_its_work(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(frontwire, "WRITE_STALL_S", 0.3)
    ended: list[str] = []

    async def flood(ex: Exchange, request: h11.Request, body: bytes) -> None:
        await ex.head(200, [("content-type", "text/event-stream")])
        try:
            while True:
                await ex.data(b"data: " + b"x" * 65536 + b"\n\n")
        except ClientGoneError as gone:
            ended.append(str(gone))
            raise

    server, port = await serving(flood)
    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(REQUEST)
    await writer.drain()
    for _ in range(100):
        if ended:
            break
        await asyncio.sleep(0.1)
    assert ended == ["the client read nothing of its answer"]
    await closed(writer)
    await stop(server)
