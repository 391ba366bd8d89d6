"""What request, reply and stream shaping share: the endpoints shaped, what a transform knows
of the request it shapes, and the JSON bytes it reads and writes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lucebox.engine.engines.kinds import EngineKind
    from lucebox.engine.plan.samplingdefaults import SamplingDefaults


CHAT_PATH = "/v1/chat/completions"
MESSAGES_PATH = "/v1/messages"
RESPONSES_PATH = "/v1/responses"
SHAPED_PATHS = (CHAT_PATH, MESSAGES_PATH, RESPONSES_PATH)


@dataclass(frozen=True)
class ShapeContext:
    """What a transform may know about the request it shapes."""

    engine: EngineKind
    """The serving engine's kind, asked what it honours."""
    path: str
    """The request path without its query, e.g. ``/v1/responses``."""
    model_id: str
    context_length: int
    """The planned context, in tokens."""
    thinking_default: bool | None
    """Whether the model thinks when a request does not say; None leaves it to the template
    (:func:`lucebox.engine.plan.chatdefaults.thinking_default`)."""
    sampling: SamplingDefaults | None = None
    """The sampling a request gets where it leaves a field unset, on either engine; None
    leaves it to the engine."""
    reply_budget: int | None = None
    """The most reply tokens the plan serves a request (:mod:`replycap`); None: no bound."""


def api_endpoint(path: str) -> str:
    """The ``/v1`` name of an API path (llama-server also answers them without ``/v1``)."""
    return path if path.startswith("/v1/") else "/v1" + path


def anthropic_id(engine_id: str) -> str:
    """An Anthropic message id (``msg_...``) for an engine's reply id, stable per reply."""
    for prefix in ("chatcmpl-", "chatcmpl_"):
        if engine_id.startswith(prefix):
            return "msg_" + engine_id[len(prefix) :]
    return "msg_" + engine_id


def json_object(body: bytes) -> dict[str, Any] | None:
    """The JSON object ``body`` holds; None for anything else (the body then passes as is)."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def count_of(value: Any) -> int | None:
    """A token count an engine sent, where it is a whole number (JSON's true is not one)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def json_bytes(doc: Mapping[str, Any]) -> bytes:
    """``doc`` as compact UTF-8 JSON, as the engines send it."""
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
