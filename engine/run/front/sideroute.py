"""Where the front sends embedding and rerank requests: the side models' own llama-server
processes (run/sideserver.py starts them), past the chat queue."""

from __future__ import annotations

from dataclasses import dataclass

import h11

from lucebox.engine.plan.sidemodels import SideRole
from lucebox.engine.run.front.frontwire import (
    HOP_HEADERS,
    EngineCall,
    Exchange,
    header_of,
    read_whole,
)

EMBED_PATHS = ("/v1/embeddings", "/embeddings", "/embedding")
RERANK_PATHS = ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking")
PATHS_OF: dict[SideRole, tuple[str, ...]] = {"embeddings": EMBED_PATHS, "rerank": RERANK_PATHS}
NOT_RELAYED = HOP_HEADERS | {b"authorization", b"x-api-key", b"origin", b"referer"}
"""Headers a client's request keeps from the process behind: its key is the front's to check,
and the side process gets its own."""
CALL_ERRORS = (OSError, h11.ProtocolError)
"""What a broken or refused connection to a process behind the front raises."""


@dataclass(frozen=True)
class SideRoute:
    """Where the front sends one side model's requests."""

    role: SideRole
    alias: str
    url: str
    paths: tuple[str, ...]
    key: str | None = None
    """The key the side llama-server reads from its key file; None: it wants none."""

    def answers(self, method: str, path: str) -> bool:
        return method == "POST" and path in self.paths


def side_listing(routes: tuple[SideRoute, ...], created_s: int) -> list[dict[str, object]]:
    """The side models as ``/v1/models`` lists them: ``type`` as LM Studio says it
    (``embeddings``), ``capabilities`` as Ollama does (``embedding``)."""
    capability = {"embeddings": "embedding", "rerank": "rerank"}
    return [
        {
            "id": route.alias,
            "object": "model",
            "created": created_s,
            "owned_by": "lucebox",
            "type": route.role,
            "capabilities": [capability[route.role]],
        }
        for route in routes
    ]


async def relay_side(
    ex: Exchange,
    request: h11.Request,
    target: str,
    body: bytes,
    route: SideRoute,
    cors: list[tuple[str, str]],
    wait_s: float,
) -> int:
    """An embedding or rerank request relayed to the process that serves it, past any chat
    queue or model gate; its whole answer back (none of them streams). The status answered."""
    headers = [
        *((k, v) for k, v in request.headers if k.lower() not in NOT_RELAYED),
        *([(b"authorization", f"Bearer {route.key}".encode())] if route.key else []),
    ]
    try:
        call = await EngineCall.open(route.url)
        try:
            answer = await call.send("POST", target, headers, body)
            whole = await read_whole(ex, call, wait_s)
        finally:
            await call.close()
    except CALL_ERRORS as exc:
        why = f"the {route.role} model {route.alias} is not answering ({exc}); try again soon"
        await ex.error(503, why, [("retry-after", "2"), *cors])
        return 503
    content_type = header_of(answer, b"content-type") or "application/json"
    await ex.whole(answer.status_code, whole, content_type, extra=cors)
    return int(answer.status_code)
