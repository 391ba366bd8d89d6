"""Where the front sends embedding and rerank requests: the side models' own llama-server
processes (run/sideserver.py starts them), past the chat queue."""

from __future__ import annotations

from dataclasses import dataclass

from lucebox.engine.plan.sidemodels import SideRole

EMBED_PATHS = ("/v1/embeddings", "/embeddings", "/embedding")
RERANK_PATHS = ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking")
PATHS_OF: dict[SideRole, tuple[str, ...]] = {"embeddings": EMBED_PATHS, "rerank": RERANK_PATHS}


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
