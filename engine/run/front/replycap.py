"""A request's reply limit within what the plan serves (pure).

Agents ask for 32K-64K reply tokens whatever the server; the Lucebox engine answers a limit that
leaves its context too small for the prompt with 400, and llama-server's page sends -1 for "no
limit", which the Lucebox engine reads as a limit. The front rewrites a limit above the plan's
reply budget, or below zero, to that budget, on both engines: the request is answered, and a
reply that fills the budget stops as one cut at its limit (``length``, ``max_tokens``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

LIMIT_KEYS: Mapping[str, tuple[str, ...]] = {
    "/v1/chat/completions": ("max_tokens", "max_completion_tokens"),
    "/v1/messages": ("max_tokens",),
    "/v1/responses": ("max_output_tokens",),
    "/v1/completions": ("max_tokens",),
}
"""Where each API carries the reply limit."""
OVERFLOW = re.compile(
    r"maximum context length is (\d+) tokens\. However, you requested \d+ tokens "
    r"\((\d+) in the messages, (\d+) in the completion\)"
)
"""The Lucebox engine's refusal of a prompt and reply limit over its context (its
``context_overflow_message``, OpenAI's wording)."""


def clamped(doc: Mapping[str, Any], endpoint: str, budget: int | None) -> dict[str, Any]:
    """``doc`` with each reply limit above ``budget`` or below zero set to ``budget``
    (None: no budget, the limits pass as they are)."""
    shaped = dict(doc)
    if budget is None:
        return shaped
    for key in LIMIT_KEYS.get(endpoint, ()):
        value = shaped.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and not 0 <= value <= budget:
            shaped[key] = budget
    return shaped


def within_room(sent: bytes, endpoint: str, refusal: bytes) -> bytes | None:
    """The request ``sent`` again with its reply limit cut to the room its prompt leaves,
    where the engine refused it (``refusal``) only for that limit; None otherwise (the
    prompt alone fills the context: the refusal stands)."""
    found = OVERFLOW.search(refusal.decode("utf-8", errors="replace"))
    if found is None:
        return None
    max_ctx, prompt_tokens, asked = (int(group) for group in found.groups())
    room = max_ctx - prompt_tokens
    if room <= 0 or asked <= room:
        return None
    try:
        doc = json.loads(sent)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    limited = {**clamped(doc, endpoint, room)}
    if not any(key in doc for key in LIMIT_KEYS.get(endpoint, ())):
        limited[LIMIT_KEYS.get(endpoint, ("max_tokens",))[0]] = room
    return json.dumps(limited, ensure_ascii=False, separators=(",", ":")).encode()
