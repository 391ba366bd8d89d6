"""lucebox's front door: the one HTTP server clients reach, whichever engine serves behind it.

It listens on the user's address and port; the engine listens on a private loopback port the
planner chose (``ServerLaunch.engine_port``). Every request passes the guard
(:mod:`frontguard`: the API key, ``Host`` and ``Origin``); a generation request then waits its
turn in :mod:`frontqueue` (the Lucebox engine serves one at a time, llama-server its slots),
waits for an engine that starts or restarts at :mod:`enginegate`, and is relayed to the engine
(:mod:`enginerelay`) with the user's key replaced by the engine's own. While a streamed
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
from dataclasses import replace
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from lucebox.engine.run.front.apishape import models_with_context
from lucebox.engine.run.front.bodyguard import body_refusal
from lucebox.engine.run.front.chatpage import PageFacts, page_answer
from lucebox.engine.run.front.codexmodels import CodexModel, asks_codex_list, codex_models
from lucebox.engine.run.front.connguard import AddressCount
from lucebox.engine.run.front.enginegate import EngineGate
from lucebox.engine.run.front.enginerelay import ENGINE_ERRORS, ClientRequest, EngineRelay
from lucebox.engine.run.front.frontcounters import FrontCounters, counters_text
from lucebox.engine.run.front.frontguard import (
    Refusal,
    admit,
    cors_headers,
    header_map,
    is_generation,
)
from lucebox.engine.run.front.frontqueue import FrontQueue, QueueFullError
from lucebox.engine.run.front.frontwire import (
    ApiShape,
    ClientGoneError,
    Exchange,
    SameShape,
    serve_connection,
)
from lucebox.engine.run.front.keyuse import KeyTally
from lucebox.engine.run.front.ownreply import failed, keepalive, sse_started
from lucebox.engine.run.front.prometheus import prometheus_text
from lucebox.engine.run.front.samplingmix import SamplingMix
from lucebox.engine.run.front.sideroute import relay_side, side_listing
from lucebox.engine.run.runstate import Status

if TYPE_CHECKING:
    from collections.abc import Callable

    import h11

    from lucebox.engine.plan.samplingdefaults import SamplingDefaults
    from lucebox.engine.run.front.frontsetup import FrontSetup
    from lucebox.engine.run.sample import QueueStatus
    from lucebox.engine.run.slots import ClientPrompt

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
        """The sampling the generation requests got (``sampling``: what fills unset fields)."""
        self.addresses = AddressCount()
        """Open connections by client address (:mod:`connguard`)."""
        self._page_facts = PageFacts(spec.model, spec.ctx, spec.images, sampling)
        # Both read the front's spec and status as they are now: a run replaces its spec on a
        # re-plan, and a test its status.
        self.gate = EngineGate(lambda: self.status())
        self.relay = EngineRelay(
            engine_url, lambda: self.spec, self.shape, self.counters, self.queue.capacity
        )
        self.on_request: Callable[[str, str], None] | None = None
        """Told each admitted request's method and path (the sleep watch wakes the engine)."""

    @property
    def client_prompt(self) -> ClientPrompt | None:
        """The last generation request relayed to the engine: the slot holds its conversation
        (the run seats and saves it before a stop or lucebox's own request)."""
        return self.relay.client_prompt

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
        asked = ClientRequest(ex, request, target, path, body, cors)
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
                await self._queued(asked, key_name)
            elif not self.gate.is_open and self.status().state == "sleeping":
                await self._asleep(asked)
            elif not self.gate.is_open:
                self.counters.answered[503] += 1
                await self.gate.answer_closed(ex, cors)
            else:
                await self.relay.relay(asked, streamed=False)
        except ClientGoneError:
            self.counters.client_gone += 1
            ex.gone.set()

    def _body_refusal(self, path: str, body: bytes) -> Refusal | None:
        return body_refusal(body, path, images=self.spec.images)

    async def _queued(self, asked: ClientRequest, key_name: str | None = None) -> None:
        ex, body, cors = asked.ex, asked.body, asked.cors
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
                failure = await self.relay.relay(
                    asked, streamed=streamed, may_retry=attempt < RELAY_ATTEMPTS, ticket=ticket
                )
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

    async def _asleep(self, asked: ClientRequest) -> None:
        """While the engine sleeps: a health check hears the server is healthy (it causes no
        wake, so it must not wait for one); any other request has woken it (``on_request``)
        and waits for it, as a generation request does."""
        ex = asked.ex
        if asked.path in ("/health", "/v1/health"):
            self.counters.answered[200] += 1
            await ex.whole(200, b'{"status":"ok"}', extra=asked.cors)
        elif await self._engine_back(ex, asked.cors, ex.arrived_s, streamed=False):
            await self.relay.relay(asked, streamed=False)

    async def _models(self, ex: Exchange, cors: list[tuple[str, str]], *, codex: bool) -> None:
        """The engine's model list with the context planned now
        (:func:`apishape.models_with_context`), or in Codex's shape where Codex asks
        (:func:`codexmodels.codex_models`); an engine that does not answer is said. An engine
        asleep is not woken: clients poll this, and the served alias is known."""
        listed: object = {}
        if self.status().state != "sleeping":
            relay = self.relay
            try:
                call, _ = await relay.call("GET", "/v1/models", relay.engine_headers, b"")
                try:
                    listed = json.loads(await relay.read_all(ex, call))
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

    def metrics_text(self) -> str:
        """Prometheus text: the run's numbers with the queue as it is now, and the front's."""
        status = replace(self.status(), queue=self.queue.status())
        return prometheus_text(status) + counters_text(self.counters)


async def start_front(front: Front, host: str, port: int) -> asyncio.Server:
    """The front listening on ``host:port`` (IPv4 and IPv6 where the host name has both)."""
    return await asyncio.start_server(front.handle, host, port)
