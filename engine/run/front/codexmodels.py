"""Codex's model list: ``GET /v1/models?client_version=...`` answered in the shape Codex reads.

Codex asks for its own document (``{"models": [ModelInfo...]}``, codex-rs
``protocol/src/openai_models.rs``), not OpenAI's list. The Lucebox engine has one, but it
says ``default_reasoning_level: "low"`` (thinking on for every Codex turn, on that engine
alone), offers efforts Codex cannot parse (``x-high``) and leaves out fields Codex requires;
llama-server has none. lucebox answers it itself on both engines from what the plan knows:
the served models, their contexts and their thinking defaults
(:func:`lucebox.engine.plan.chatdefaults.thinking_default`). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

CODEX_QUERY = "client_version"
"""The query key Codex adds to its model-list request."""
EFFORTS = (
    ("none", "Answers without thinking"),
    ("low", "Thinks before answering"),
    ("medium", "Thinks before answering"),
    ("high", "Thinks before answering"),
)
"""Efforts every Codex release parses; lucebox turns thinking on for all but ``none``
(``apishape._asked_thinking``), so they differ only there."""
BASE_INSTRUCTIONS = (
    "You are a coding agent in the Codex CLI, running on a local model served by lucebox. "
    "Use the shell tool to read files, change them and run commands; keep replies short."
)
"""Codex's system prompt for a listed model (required): short, as a small local context needs."""
TOOL_OUTPUT_TOKENS = 10_000
"""Codex's own truncation of a tool's output, cut to a quarter of a smaller context."""


@dataclass(frozen=True)
class CodexModel:
    """One served model as Codex's list offers it."""

    model_id: str
    context_tokens: int
    thinking_default: bool | None
    """The plan's default; False: Codex's default effort is ``none`` so it never turns
    thinking on by itself; None: no default is said and the template decides."""
    images: bool = False
    """The model reads images (a vision projector is served)."""


def asks_codex_list(target: str) -> bool:
    """Whether a ``/v1/models`` request target is Codex's (it carries ``client_version``)."""
    return CODEX_QUERY in parse_qs(urlsplit(target).query, keep_blank_values=True)


def codex_models(models: Sequence[CodexModel]) -> dict[str, Any]:
    """Codex's ``ModelsResponse`` for the served ``models``, in serving order."""
    return {"models": [_model_info(model, rank) for rank, model in enumerate(models, 1)]}


def _model_info(model: CodexModel, priority: int) -> dict[str, Any]:
    info: dict[str, Any] = {
        "slug": model.model_id,
        "display_name": model.model_id,
        "description": f"Served by lucebox ({model.context_tokens}-token context)",
        "supported_reasoning_levels": [
            {"effort": effort, "description": text} for effort, text in EFFORTS
        ],
        "shell_type": "shell_command",
        "visibility": "list",
        "supported_in_api": True,
        "priority": priority,
        "upgrade": None,
        "base_instructions": BASE_INSTRUCTIONS,
        "supports_reasoning_summaries": False,
        "support_verbosity": False,
        "default_verbosity": None,
        "apply_patch_tool_type": None,
        "truncation_policy": {
            "mode": "tokens",
            "limit": min(TOOL_OUTPUT_TOKENS, model.context_tokens // 4),
        },
        "supports_parallel_tool_calls": False,
        "context_window": model.context_tokens,
        "experimental_supported_tools": [],
        "input_modalities": ["text", "image"] if model.images else ["text"],
    }
    if model.thinking_default is not None:
        info["default_reasoning_level"] = "medium" if model.thinking_default else "none"
    return info
