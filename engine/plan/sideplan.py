"""The launch with its embedding and reranker models: read their files' headers (the edge) and
plan them (pure, :mod:`sidemodels`) in the memory the chat plan leaves."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from lucebox.engine.core.errors import UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.plan import modelfiles
from lucebox.engine.plan.launch import private_port
from lucebox.engine.plan.launchplan import LaunchPlan
from lucebox.engine.plan.sidemodels import SideHost, plan_sides, read_side_file


def with_side_models(paths: Paths, chat: LaunchPlan) -> LaunchPlan:
    """``chat`` with the side models its options ask for; a side model that does not fit
    refuses the launch (the chat model keeps its memory, and nothing named is dropped)."""
    resolved = chat.resolved
    if not resolved.side_models:
        return chat
    files = tuple(
        read_side_file(role, source, side_path(paths, role, source))
        for role, source in resolved.side_models
    )
    memory = chat.plan.memory_bytes
    server = chat.server
    host = SideHost(
        server_path=chat.installs.llama_server.server_path,
        api_key_file=server.api_key_file,
        on_gpu=chat.budget.is_gpu,
        gpus=str(server.gpus[0]) if server.gpus else "",
        engine_port=server.engine_port or private_port(resolved.port),
    )
    headroom_bytes = memory.available - memory.total - memory.reserve
    sides = plan_sides(files, headroom_bytes=headroom_bytes, host=host)
    return replace(chat, sides=sides, refusal=chat.refusal or sides.refusal)


def side_path(paths: Paths, role: str, source: str) -> Path:
    """The file of a side model the user named: it is planned from its header, so it must be
    on disk (a path, or pulled into the store)."""
    found = modelfiles.local_file(paths, source)
    if found is None or not found.exists():
        raise UsageError(
            f"the {role} model {source} is not on disk",
            hint=f"give a GGUF path, or run `lucebox models pull {source}` first",
        )
    return found
