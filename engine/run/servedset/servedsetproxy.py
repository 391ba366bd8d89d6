"""A thin proxy in front of the router: it frees memory before a model loads, by the plans.

Clients talk to the proxy on the served address; it reads the ``model`` a request names (the
JSON body's, or ``?model=``), has the least recently used models on that model's device
unloaded through the router's ``/models/unload`` until it fits (admission.py), then passes
the request and streams the answer back unchanged; ``POST /models/load`` goes the same way, so
a load asked for by name makes room like a request does. HTTP on the client side is
:mod:`frontwire`'s, shared with the single engine's front, and so are its rules
(:mod:`frontguard`): the key, and a ``Host`` and ``Origin`` of this server only, so a web page
cannot drive the set's loopback API. The API normalizations of the front (:mod:`apishape`)
apply per model, by the model a request names; a stream the router leaves silent between two
events hears a keep-alive comment every few seconds, as the front's do. The router runs with no
count limit on a loopback port of its own. An unknown model name is answered here, naming the
served ones.

Every unload is the proxy's, and each saves the model's slot first (:mod:`servedsetslots`):
an eviction for room, a model that answered nothing for the set's idle time (the router's
own sleep is off) and ``POST /models/unload``. A request for a model the gate found unloaded
waits until it loads and its saved slot is restored.

The gate counts only what the router lists (:mod:`routerlist`). While the router lists no
models (starting, restarting) it asks again for a couple of seconds, then refuses the request
with 503 and why, as the router itself answers while it starts: admitting it could load a model
past the memory budget, and waiting longer would hold every request behind the gate's lock for
a router that may not come back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import h11
import httpx

from lucebox.engine.run.front.apishape import Shapes, models_with_context
from lucebox.engine.run.front.codexmodels import CodexModel, asks_codex_list, codex_models
from lucebox.engine.run.front.connguard import AddressCount
from lucebox.engine.run.front.frontguard import (
    PUBLIC_PATHS,
    FrontPolicy,
    cors_headers,
    header_map,
    is_generation,
    is_page_file,
    refusal,
)
from lucebox.engine.run.front.frontwire import (
    HOP_HEADERS,
    KEEPALIVE_COMMENT,
    KEEPALIVE_S,
    ApiShape,
    ClientGoneError,
    EventShape,
    Exchange,
    SameShape,
    serve_connection,
    split_events,
)
from lucebox.engine.run.front.sideroute import SideRoute, relay_side, side_listing
from lucebox.engine.run.servedset.admission import Placement, evictions
from lucebox.engine.run.servedset.routerlist import LIST_WAIT_S, ModelListError, router_list
from lucebox.engine.run.servedset.servedsethang import child_client
from lucebox.engine.run.servedset.servedsetslots import ModelSlot, SetSlots
from lucebox.engine.run.servedsetmodels import router_states

UNLOAD_TIMEOUT_S = 60.0
UNLOAD_POLL_S = 0.05
LIST_PATHS = frozenset({"/v1/models", "/models"})
IDLE_CHECK_S = 5.0
"""How often the idle unload looks, at most (an idle time of an hour needs no finer look)."""


def model_of(target: bytes, body: bytes) -> str | None:
    """The model a request names: the JSON body's ``model``, else the ``model`` query."""
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        data = json.loads(body) if body else None
        if isinstance(data, dict) and isinstance(data.get("model"), str):
            return str(data["model"])
    found = parse_qs(urlsplit(target.decode("latin-1")).query).get("model")
    return found[0] if found else None


class ModelGate:
    """Admits a request for a model once it fits beside the loaded ones on its device; the
    one that unloads models (each saves its slot first) and restores a loaded one's."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        placements: Mapping[str, Placement],
        room_bytes: Mapping[str, int],
        slots: SetSlots | None = None,
    ) -> None:
        self.client = client
        self.placements = placements
        self.room_bytes = room_bytes
        self.slots = slots or SetSlots(client, client, Path(), {})
        self.last_used_s: dict[str, float] = {}
        self.busy: Counter[str] = Counter()
        self.cold: set[str] = set()
        """Models found unloaded whose next process has not had its saved slot restored."""
        self.list_wait_s = LIST_WAIT_S
        """How long a look at what runs waits for a router that answers no list."""
        self._lock = asyncio.Lock()
        self._warming: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    async def _running(self, states: tuple[str, ...] = ("loaded", "loading")) -> frozenset[str]:
        """The models in one of ``states`` in the router.

        Raises:
            ModelListError: the router listed no models (:mod:`routerlist`).
        """
        found = router_states(await router_list(self.client, self.list_wait_s))
        return frozenset(a for a, s in found.items() if s in states)

    async def _loaded(self) -> frozenset[str]:
        """Loaded or loading in the router, or admitted and not yet seen loading there."""
        return await self._running() | self.in_flight()

    async def admit(self, alias: str) -> str | None:
        """None once ``alias`` may load; else why it cannot: busy models fill its device, or
        the router lists no models (starting, restarting), so what it would load beside is
        unknown and admitting it could pass the memory budget."""
        async with self._lock:
            self.last_used_s[alias] = time.monotonic()
            busy = self.in_flight()
            try:
                running = await self._running()
            except ModelListError as exc:
                return f"cannot tell which models run beside {alias} ({exc}); try again"
            if alias not in running:
                self.cold.add(alias)
            victims = evictions(
                alias,
                running | busy,
                self.placements,
                self.room_bytes,
                self.last_used_s,
                busy,
            )
            if victims is None:
                return f"{alias} does not fit beside the models answering requests now"
            for victim in victims:
                await self._unload(victim)
            self.busy[alias] += 1
            return None

    async def _unload(self, victim: str) -> None:
        """Save ``victim``'s slot, then have the router unload it."""
        await self.slots.save(victim)
        await self.client.post("/models/unload", json={"model": victim})
        await self._gone(victim)
        self.last_used_s.pop(victim, None)  # its idle time starts again when it loads

    async def warm(self, alias: str) -> None:
        """Once an admitted model the gate found unloaded has loaded, its saved slot restored,
        before any request to it passes."""
        async with self._warming[alias]:
            if alias in self.cold:
                await self.slots.restore(alias)
                self.cold.discard(alias)

    async def unload_idle(self, idle_s: float) -> None:
        """Forever: each loaded model that has answered nothing through the proxy for
        ``idle_s`` is unloaded, its slot saved first (the set's one idle timer)."""
        while True:
            await asyncio.sleep(min(IDLE_CHECK_S, idle_s / 2))
            with contextlib.suppress(httpx.HTTPError, ModelListError):
                async with self._lock:
                    now_s = time.monotonic()
                    for alias in await self._running(("loaded",)) - self.in_flight():
                        # One loaded past the gate (the dashboard's key) idles from now.
                        if now_s - self.last_used_s.setdefault(alias, now_s) >= idle_s:
                            await self._unload(alias)

    async def _gone(self, victim: str) -> None:
        """Wait until the router no longer runs ``victim`` (its process has exited), at most
        :data:`UNLOAD_TIMEOUT_S`; a router listing no models has not shown that yet."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(UNLOAD_TIMEOUT_S):
                while True:
                    with contextlib.suppress(ModelListError):
                        if victim not in await self._loaded():
                            return
                    await asyncio.sleep(UNLOAD_POLL_S)

    def done(self, alias: str) -> None:
        self.busy[alias] -= 1
        self.last_used_s[alias] = time.monotonic()  # idle from the end of its last answer

    def in_flight(self) -> frozenset[str]:
        """The models answering a request through the proxy now."""
        return frozenset(alias for alias, count in self.busy.items() if count)


class ServedSetProxy:
    """Serves the set's address; every request goes on to ``client``'s router."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        gate: ModelGate,
        policy: FrontPolicy,
        shapes: Mapping[str, Shapes] | None = None,
        keepalive_s: float = KEEPALIVE_S,
        sides: tuple[SideRoute, ...] = (),
        models_wait_s: float = LIST_WAIT_S,
    ) -> None:
        self.client = client
        self.gate = gate
        self.policy = policy
        self.shapes = shapes or {}
        """Each model's API shaping, by alias (a request naming none passes unchanged)."""
        self.keepalive_s = keepalive_s
        self.sides = sides
        """The embedding and reranker models' own processes: their requests skip the gate."""
        self.addresses = AddressCount()
        """Open connections by client address (:mod:`~lucebox.engine.run.front.connguard`)."""
        self.models_wait_s = models_wait_s
        self._seen_models: dict[str, dict[str, Any]] = {}
        """Each model's entry in the router's last list: the list while it answers none."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_connection(reader, writer, self._answer, self.addresses)

    async def _answer(self, ex: Exchange, request: h11.Request, body: bytes) -> None:
        method = request.method.decode("latin-1")
        path = urlsplit(request.target.decode("latin-1")).path
        refused = refusal(self.policy, method, path, header_map(request.headers))
        if refused is not None:
            await ex.error(refused.status, refused.message)
            return
        ex.watch()  # a client that hangs up ends its request in the router too
        if side := next((r for r in self.sides if r.answers(method, path)), None):
            # Another process answers it: it must neither wait for room nor evict a model.
            target = request.target.decode("latin-1")
            await relay_side(ex, request, target, body, side, [], self.keepalive_s)
            return
        if method == "GET" and path in LIST_PATHS:
            with contextlib.suppress(ClientGoneError):
                origin = header_map(request.headers).get("origin")  # allowed, as refusal says
                await self._models(ex, request.target.decode("latin-1"), cors_headers(origin))
            return
        # A request the key does not guard (a preflight, /health, the page's files) names no
        # model: it must not make the gate unload others for it.
        public = method == "OPTIONS" or path in PUBLIC_PATHS or is_page_file(path)
        alias = None if public else model_of(request.target, body)
        if alias is not None and alias not in self.gate.placements:
            served = ", ".join(self.gate.placements)
            await ex.error(404, f"model '{alias}' is not served; served: {served}")
            return
        if path == "/models/unload":
            if alias is not None:
                await self.gate.slots.save(alias)
            alias = None  # an unload needs no room: it goes on without evicting anything
        try:
            no_room = await self.gate.admit(alias) if alias is not None else None
        except httpx.HTTPError as exc:
            await ex.error(502, f"the router did not answer: {exc}")
            return
        if no_room is not None:
            await ex.error(503, no_room)
            return
        shape = self.shapes.get(alias, SameShape()) if alias is not None else SameShape()
        try:
            if alias is not None and path != "/models/load":  # a load asks for no slot
                await self.gate.warm(alias)
            await self._forward(ex, request, body, shape, alias)
        except ClientGoneError:
            return
        finally:
            if alias is not None:
                self.gate.done(alias)

    async def _forward(
        self, ex: Exchange, request: h11.Request, body: bytes, shape: ApiShape, alias: str | None
    ) -> None:
        target = request.target.decode("latin-1")
        path = urlsplit(target).path
        dropped = (*HOP_HEADERS, b"accept-encoding")
        headers = [(k, v) for k, v in request.headers if k.lower() not in dropped]
        # Bodies come back as sent: a JSON reply is reshaped, so it must not arrive compressed.
        headers.append((b"accept-encoding", b"identity"))
        sent = shape.request(path, body) if body else body
        if alias is not None and is_generation(request.method.decode("latin-1"), path):
            self.gate.slots.sent(alias, path, sent)
        upstream = self.client.build_request(
            request.method.decode(), target, headers=headers, content=sent
        )
        try:
            answer = await self.client.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            await ex.error(502, f"the router did not answer: {exc}")
            return
        try:
            kept = [(k, v) for k, v in answer.headers.raw if k.lower() not in HOP_HEADERS]
            content_type = answer.headers.get("content-type", "")
            await ex.head(answer.status_code, kept)
            if "text/event-stream" in content_type:
                await self._pipe_events(ex, answer, shape.stream(path, body))
            elif "application/json" in content_type:
                whole = b"".join([chunk async for chunk in self._chunks(ex, answer)])
                await ex.data(shape.reply(path, answer.status_code, whole))
            else:
                async for chunk in answer.aiter_raw():
                    await ex.data(chunk)
            await ex.end()
        finally:
            await answer.aclose()

    async def _models(self, ex: Exchange, target: str, cors: list[tuple[str, str]]) -> None:
        """The model list, always a valid one: the router's with each model's planned context
        (:func:`apishape.models_with_context`) and the side models, or Codex's own list where
        Codex asks (:func:`codexmodels.codex_models`, from the plans alone). While the router
        answers no list, each model of the set as the router last listed it (its state then),
        or by its name alone."""
        now_s = int(time.time())
        if asks_codex_list(target):
            served = [
                CodexModel(alias, s.context_length, s.thinking_default)
                for alias, s in self.shapes.items()
            ]
            await ex.whole(200, json.dumps(codex_models(served)).encode(), extra=cors)
            return
        try:
            listed = await router_list(self.gate.client, self.models_wait_s)
        except ModelListError:
            known = [self._seen_models.get(alias, {"id": alias}) for alias in self.gate.placements]
            listed = {"object": "list", "data": known}
        else:
            entries = [e for e in listed["data"] if isinstance(e, dict)]
            self._seen_models = {e["id"]: e for e in entries if isinstance(e.get("id"), str)}
        contexts = {alias: served.context_length for alias, served in self.shapes.items()}
        document = models_with_context(listed, contexts, now_s)
        document.setdefault("data", []).extend(side_listing(self.sides, now_s))
        await ex.whole(200, json.dumps(document).encode(), extra=cors)

    async def _pipe_events(self, ex: Exchange, answer: httpx.Response, shaper: EventShape) -> None:
        """The router's events on as they come, each through ``shaper``, and a comment
        whenever it is silent for ``keepalive_s`` between two events (never inside one)."""
        held = bytearray()  # the start of an event whose end has not come yet
        async for chunk in self._chunks(ex, answer, keepalive=lambda: not held):
            events, rest = split_events(bytes(held) + chunk)
            held[:] = rest
            await ex.data(b"".join(shaper.feed(event) for event in events))
        await ex.data(shaper.close() + bytes(held))

    async def _chunks(
        self,
        ex: Exchange,
        answer: httpx.Response,
        keepalive: Callable[[], bool] = lambda: False,
    ) -> AsyncIterator[bytes]:
        """The router's answer as it comes; while it is silent, a keep-alive comment every
        ``keepalive_s`` whenever ``keepalive()`` says one may go now. A client that hangs up
        raises ClientGoneError (the answer is closed by the caller, which ends the request)."""
        raw = answer.aiter_raw()
        while True:
            reading = asyncio.ensure_future(anext(raw, None))
            try:
                while not await ex.wait(reading, self.keepalive_s):
                    if keepalive():
                        await ex.data(KEEPALIVE_COMMENT)
                chunk = reading.result()
            finally:
                if not reading.done():
                    reading.cancel()
                    with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                        await reading
            if chunk is None:
                return
            yield chunk


async def start_proxy(
    host: str,
    port: int,
    router_url: str,
    placements: Mapping[str, Placement],
    room_bytes: Mapping[str, int],
    headers: Mapping[str, str],
    policy: FrontPolicy,
    shapes: Mapping[str, Shapes],
    sides: tuple[SideRoute, ...] = (),
    slots: tuple[Path, Mapping[str, ModelSlot]] = (Path(), {}),
) -> tuple[asyncio.Server, tuple[httpx.AsyncClient, ...], ModelGate]:
    """The proxy listening on ``host:port`` for the router at ``router_url``, by ``policy``'s
    rules; ``headers`` (the API key) go only with the proxy's own calls, a client's request
    keeps its own; its gate knows which models answer a request now and keeps their slots
    (``slots``: the set's folder and each saving model's slot); ``sides`` are the side
    models' processes, answered past the gate."""
    admin = httpx.AsyncClient(base_url=router_url, timeout=30.0, headers=dict(headers))
    client = httpx.AsyncClient(base_url=router_url, timeout=None)
    engines = child_client(30.0)
    gate = ModelGate(admin, placements, room_bytes, SetSlots(admin, engines, *slots))
    proxy = ServedSetProxy(client, gate, policy, shapes, sides=sides)
    server = await asyncio.start_server(proxy.handle, host, port)
    return server, (client, admin, engines), gate
