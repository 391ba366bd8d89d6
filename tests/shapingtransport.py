"""The front's shaping hook in miniature, for tests: a transport of the official SDKs' HTTP
client (httpx2) that passes each request body through ``shape_request`` and each reply
through ``shape_response`` or a ``StreamShaper`` fed the engine's bytes as they arrive."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2

from lucebox.engine.engines.registry import KindName
from lucebox.engine.run.apishape import (
    ShapeContext,
    StreamShaper,
    shape_request,
    shape_response,
)

HOP_HEADERS = ("content-length", "transfer-encoding", "connection", "content-encoding")


class ShapedStream(httpx2.SyncByteStream):
    def __init__(self, upstream: httpx2.Response, shaper: StreamShaper) -> None:
        self.upstream, self.shaper = upstream, shaper

    def __iter__(self) -> Iterator[bytes]:
        for piece in self.upstream.iter_raw():
            yield self.shaper.feed(piece)
        yield self.shaper.close()

    def close(self) -> None:
        self.upstream.close()


class ShapingTransport(httpx2.BaseTransport):
    """Shapes what passes to and from an engine; each request on a fresh connection
    (llama-server drops a kept-alive one after a stream)."""

    def __init__(
        self, engine: KindName, model_id: str, thinking_default: bool | None = False
    ) -> None:
        self.inner = httpx2.HTTPTransport()
        self.engine, self.model_id = engine, model_id
        self.thinking_default = thinking_default

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        ctx = ShapeContext(
            self.engine, request.url.path, self.model_id, 2048, self.thinking_default
        )
        body = shape_request(ctx, request.read())
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_HEADERS]
        upstream = self.inner.handle_request(
            httpx2.Request(
                request.method,
                request.url,
                headers=[*headers, ("connection", "close")],
                content=body,
            )
        )
        kept = [(k, v) for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS]
        if upstream.headers.get("content-type", "").startswith("text/event-stream"):
            stream = ShapedStream(upstream, StreamShaper(ctx, body))
            return httpx2.Response(upstream.status_code, headers=kept, stream=stream)
        content = shape_response(ctx, upstream.status_code, upstream.read())
        upstream.close()
        return httpx2.Response(upstream.status_code, headers=kept, content=content)
