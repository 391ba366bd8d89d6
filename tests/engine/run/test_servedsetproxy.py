"""The proxy's own choices in front of a router that answers like the real one (scripted: the
router's states on cue, its calls recorded); the real router behind it is in the set's e2e
tests."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx

from lucebox.engine.run.front.apishape import Shapes
from lucebox.engine.run.front.frontguard import FrontPolicy
from lucebox.engine.run.front.sideroute import EMBED_PATHS, SideRoute
from lucebox.engine.run.servedset.admission import Placement
from lucebox.engine.run.servedset.servedsethang import child_client
from lucebox.engine.run.servedset.servedsetproxy import ModelGate, ServedSetProxy, start_proxy
from support import codexlist
from support.frontserver import loopback_policy

MIB = 2**20
PLACEMENTS = {"smollm2": Placement("ram", 563 * MIB), "smoke": Placement("ram", 891 * MIB)}
ROOM = {"ram": 960 * MIB}  # one at a time


class Streamed(httpx.AsyncByteStream):
    """A body the proxy reads as it streams a real router's (a plain one arrives read), in
    ``pieces`` with ``pause_s`` between them."""

    def __init__(self, *pieces: bytes, pause_s: float = 0.0) -> None:
        self.pieces = pieces
        self.pause_s = pause_s

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for index, piece in enumerate(self.pieces):
            if index:
                await asyncio.sleep(self.pause_s)
            yield piece


def answer_json(document: object) -> httpx.Response:
    headers = {"content-type": "application/json"}
    return httpx.Response(200, headers=headers, stream=Streamed(json.dumps(document).encode()))


def scripted_router(loaded: set[str], calls: list[tuple[str, str]]) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path in ("/models", "/v1/models"):
            states = {a: "loaded" if a in loaded else "unloaded" for a in PLACEMENTS}
            data = [{"id": a, "status": {"value": s}} for a, s in states.items()]
            return answer_json({"data": data})
        model = json.loads(request.content)["model"]
        calls.append((request.url.path, model))
        if request.url.path == "/models/unload":
            loaded.discard(model)
        elif request.url.path == "/models/load":
            loaded.add(model)
        return answer_json({"success": True})

    return httpx.MockTransport(answer)


async def ask(proxy: ServedSetProxy, path: str, model: str) -> httpx.Response:
    """One request to the proxy through a real loopback socket."""
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            return await client.post(path, json={"model": model})
    finally:
        server.close()


async def test_a_load_by_name_makes_room_like_a_request_and_an_unload_evicts_nothing():
    loaded = {"smollm2"}
    calls: list[tuple[str, str]] = []
    router = scripted_router(loaded, calls)
    async with (
        httpx.AsyncClient(base_url="http://router", transport=router) as admin,
        httpx.AsyncClient(base_url="http://router", transport=router) as client,
    ):
        proxy = ServedSetProxy(client, ModelGate(admin, PLACEMENTS, ROOM), loopback_policy())
        assert (await ask(proxy, "/models/load", "smoke")).status_code == 200
        assert calls == [("/models/unload", "smollm2"), ("/models/load", "smoke")]
        calls.clear()
        # Unloading a model that is not loaded needs no room: smoke stays.
        assert (await ask(proxy, "/models/unload", "smollm2")).status_code == 200
        assert calls == [("/models/unload", "smollm2")]
        assert loaded == {"smoke"}


async def test_the_rules_of_the_front_hold_for_the_set_and_silent_streams_hear_keepalives():
    events = (b'data: {"n": 1}\n\n', b'data: {"n": 2}\n\n', b"data: [DONE]\n\n")

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/models":
            return answer_json({"data": [{"id": "smollm2", "status": {"value": "loaded"}}]})
        headers = {"content-type": "text/event-stream"}
        # The router is silent for a while between two events, as in a long prefill.
        return httpx.Response(200, headers=headers, stream=Streamed(*events, pause_s=0.35))

    router = httpx.MockTransport(answer)
    policy = FrontPolicy("0.0.0.0", 0, "k3y")
    async with (
        httpx.AsyncClient(base_url="http://router", transport=router) as admin,
        httpx.AsyncClient(base_url="http://router", transport=router) as client,
    ):
        gate = ModelGate(admin, PLACEMENTS, ROOM)
        proxy = ServedSetProxy(client, gate, policy, keepalive_s=0.1)
        server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        body = {"model": "smollm2", "stream": True}
        try:
            async with httpx.AsyncClient(base_url=url, timeout=10) as http:
                assert (await http.post("/v1/chat/completions", json=body)).status_code == 401
                rebound = {"Authorization": "Bearer k3y", "Host": "attacker.example"}
                assert (
                    await http.post("/v1/chat/completions", json=body, headers=rebound)
                ).status_code == 421
                foreign = {"Authorization": "Bearer k3y", "Origin": "http://attacker.example"}
                assert (
                    await http.post("/v1/chat/completions", json=body, headers=foreign)
                ).status_code == 403
                # What the key does not guard names no model: the gate unloads nothing for it.
                for method, path in (("OPTIONS", "/v1/chat/completions"), ("GET", "/health")):
                    await http.request(method, path, params={"model": "smollm2"}, json=body)
                assert not gate.busy and not gate.last_used_s
                keyed = {"Authorization": "Bearer k3y"}
                reply = await http.post("/v1/chat/completions", json=body, headers=keyed)
        finally:
            server.close()
    assert reply.status_code == 200
    text = reply.text
    assert text.count(": keep-alive") >= 2
    # Comments only between events: every event arrives whole and in order.
    assert [line for line in text.split("\n\n") if line.startswith("data")] == [
        e.decode().strip() for e in events
    ]


async def test_codex_gets_its_own_list_naming_each_model_of_the_set():
    def answer(request: httpx.Request) -> httpx.Response:
        return answer_json({"object": "list", "data": [{"id": a} for a in PLACEMENTS]})

    shapes = {
        "smollm2": Shapes("llama-server", "smollm2", 4096, None),
        "smoke": Shapes("llama-server", "smoke", 8192, False),
    }
    router = httpx.MockTransport(answer)
    async with httpx.AsyncClient(base_url="http://router", transport=router) as client:
        gate = ModelGate(client, PLACEMENTS, ROOM)
        proxy = ServedSetProxy(client, gate, loopback_policy(), shapes=shapes, models_wait_s=0.5)
        server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            async with httpx.AsyncClient(base_url=url, timeout=10) as http:
                codex = (await http.get("/v1/models?client_version=0.169.0")).json()
                plain = (await http.get("/v1/models")).json()
        finally:
            server.close()
    assert codexlist.problems(codex) == []
    listed = [(m["slug"], m["context_window"]) for m in codex["models"]]
    assert listed == [("smollm2", 4096), ("smoke", 8192)]
    assert [m.get("default_reasoning_level") for m in codex["models"]] == [None, "none"]
    assert [m["context_length"] for m in plain["data"]] == [4096, 8192]


async def fake_side(seen: list[bytes]) -> asyncio.Server:
    """A side model's process: records each request and answers one embedding."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        seen.append(head + await reader.readexactly(length))
        body = json.dumps({"data": [{"embedding": [0.5, 0.5], "index": 0}]}).encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0)


async def test_an_embedding_reaches_its_side_process_past_the_gate_and_is_listed():
    loaded = {"smollm2"}
    calls: list[tuple[str, str]] = []
    router = scripted_router(loaded, calls)
    seen: list[bytes] = []
    side_server = await fake_side(seen)
    side_port = side_server.sockets[0].getsockname()[1]
    route = SideRoute("embeddings", "minilm", f"http://127.0.0.1:{side_port}", EMBED_PATHS)
    try:
        async with (
            httpx.AsyncClient(base_url="http://router", transport=router) as admin,
            httpx.AsyncClient(base_url="http://router", transport=router) as client,
        ):
            gate = ModelGate(admin, PLACEMENTS, ROOM)
            proxy = ServedSetProxy(client, gate, loopback_policy(None), sides=(route,))
            answer = await ask(proxy, "/v1/embeddings", "minilm")
            listed = await ask_get(proxy, "/v1/models")
    finally:
        side_server.close()
    assert answer.status_code == 200, answer.text
    assert answer.json()["data"][0]["embedding"] == [0.5, 0.5]
    assert len(seen) == 1 and b'"minilm"' in seen[0]
    # Not the gate's: no room asked for, no model loaded or unloaded, none admitted.
    assert calls == [] and loaded == {"smollm2"} and gate.last_used_s == {}
    assert {"id": "minilm", "type": "embeddings"}.items() <= listed.json()["data"][-1].items()


async def ask_get(proxy: ServedSetProxy, path: str) -> httpx.Response:
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            return await client.get(path)
    finally:
        server.close()


LOADING = {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}
"""The router's answer to any request before its HTTP layer is ready (``middleware_server_state``
in tools/server/server-http.cpp of the pinned llama.cpp)."""


async def test_the_model_list_is_a_list_whatever_the_router_answers():
    script: list[str] = []  # what the router does next: "loading", "down"; a list when empty

    def answer(request: httpx.Request) -> httpx.Response:
        if script and script[0] == "down":
            raise httpx.ConnectError("connection refused", request=request)
        if script:
            script.pop(0)
            headers = {"content-type": "application/json; charset=utf-8"}
            return httpx.Response(
                503, headers=headers, stream=Streamed(json.dumps(LOADING).encode())
            )
        states = {"smollm2": "loaded", "smoke": "unloaded"}
        data = [{"id": a, "status": {"value": s}} for a, s in states.items()]
        return answer_json({"object": "list", "data": data})

    shapes = {
        "smollm2": Shapes("llama-server", "smollm2", 4096, None),
        "smoke": Shapes("llama-server", "smoke", 8192, False),
    }
    router = httpx.MockTransport(answer)
    async with (
        httpx.AsyncClient(base_url="http://router", transport=router) as admin,
        httpx.AsyncClient(base_url="http://router", transport=router) as client,
    ):
        gate = ModelGate(admin, PLACEMENTS, ROOM)
        proxy = ServedSetProxy(client, gate, loopback_policy(), shapes=shapes, models_wait_s=0.5)
        first = await ask_get(proxy, "/v1/models")
        script[:] = ["loading", "loading"]  # its start: the list once it is ready
        started = await ask_get(proxy, "/models")
        script[:] = ["loading"] * 100
        starting = await ask_get(proxy, "/v1/models")
        script[:] = ["down"]
        down = await ask_get(proxy, "/v1/models")
    states = {"smollm2": "loaded", "smoke": "unloaded"}
    for reply in (first, started, starting, down):
        assert reply.status_code == 200, reply.text
        document = reply.json()
        assert document["object"] == "list"
        listed_states = {m["id"]: m["status"]["value"] for m in document["data"]}
        assert listed_states == states  # as the router said, or last said
        assert [m["context_length"] for m in document["data"]] == [4096, 8192]
    assert not script or script[0] == "down"


def loading_answer() -> httpx.Response:
    headers = {"content-type": "application/json; charset=utf-8"}
    return httpx.Response(503, headers=headers, stream=Streamed(json.dumps(LOADING).encode()))


class StartingRouter:
    """The router with ``loaded`` running, answering its ``/models`` with 503 "Loading model"
    ``loading_lists`` more times (a start, a restart); an unloaded model's process stays listed
    until the router has answered 503 three more times. Each load records what ran then."""

    def __init__(self, loaded: set[str], loading_lists: int) -> None:
        self.loaded = loaded
        self.loading_lists = loading_lists
        self.exiting: set[str] = set()
        self.loads: list[tuple[str, frozenset[str]]] = []
        self.transport = httpx.MockTransport(self.answer)

    def answer(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/models":
            if self.loading_lists:
                self.loading_lists -= 1
                return loading_answer()
            self.loaded -= self.exiting
            self.exiting.clear()
            states = {a: "loaded" if a in self.loaded else "unloaded" for a in PLACEMENTS}
            return answer_json(
                {"data": [{"id": a, "status": {"value": s}} for a, s in states.items()]}
            )
        model = json.loads(request.content)["model"]
        if request.url.path == "/models/unload":
            self.exiting.add(model)
            self.loading_lists = 3
        elif request.url.path == "/models/load":
            self.loads.append((model, frozenset(self.loaded)))
            self.loaded.add(model)
        return answer_json({"success": True})


async def test_a_router_that_lists_no_models_admits_nothing_past_the_budget():
    router = StartingRouter({"smollm2"}, loading_lists=1000)
    async with httpx.AsyncClient(base_url="http://router", transport=router.transport) as admin:
        gate = ModelGate(admin, PLACEMENTS, ROOM)
        gate.list_wait_s = 0.3
        proxy = ServedSetProxy(admin, gate, loopback_policy())
        # Still starting past the wait: refused with why, nothing loads beside smollm2.
        refused = await ask(proxy, "/models/load", "smoke")
        assert refused.status_code == 503
        message = refused.json()["error"]["message"]
        assert "cannot tell which models run beside smoke" in message
        assert "503 (Loading model)" in message
        assert router.loads == [] and not gate.in_flight()
        # Ready within the wait: smoke is admitted once smollm2 has been seen to exit, which
        # the router's 503s after the unload do not show.
        router.loading_lists = 2
        gate.list_wait_s = 2.0
        assert (await ask(proxy, "/models/load", "smoke")).status_code == 200
    assert router.loads == [("smoke", frozenset())]
    assert router.loaded == {"smoke"}


async def keepalive_process() -> tuple[asyncio.Server, int, asyncio.Event]:
    """An HTTP/1.1 server that keeps each connection open for the next request, as a model's
    process does, and says when its client closed one."""
    closed = asyncio.Event()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            closed.set()
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], closed


async def test_calls_to_a_models_own_process_leave_no_idle_connection_to_hold_its_exit():
    # A model's process waits for an idle connection before it exits: an eviction would wait.
    process, port, closed = await keepalive_process()
    server, clients, gate = await start_proxy(
        "127.0.0.1", 0, "http://127.0.0.1:9", PLACEMENTS, ROOM, {}, loopback_policy(), {}
    )
    try:
        assert (await gate.slots.engines.get(f"http://127.0.0.1:{port}/slots")).json() == []
        await asyncio.wait_for(closed.wait(), 2.0)  # the reseat's, save's and restore's client
        closed.clear()
        async with child_client(5.0) as looker:  # the hang watch's and guard's looks
            await looker.get(f"http://127.0.0.1:{port}/slots")
            await asyncio.wait_for(closed.wait(), 2.0)
    finally:
        server.close()
        for client in clients:
            await client.aclose()
        process.close()
