"""The chat template and thinking default a model gets, whichever engine serves it.

Pure: the planner asks with the engine kind, the target's architecture and its template; the
answer goes into the plan document (``"chat"``) and, as ``thinking_default``, into the front's
request shaping (:mod:`lucebox.engine.run.front.apishape`), which sets it on every request that does
not say, on both engines.

Thinking: the Lucebox engine keeps thinking off unless a request asks (its source:
"Qwen3.6 thinking wrecks DFlash acceptance rates"), while llama-server follows the model's
template (Qwen3.5/3.6 think by default). For every family the Lucebox engine serves, the
default is OFF on both engines: the fast engine keeps its DDTree acceptance and the same model
answers the same way wherever it runs; clients opt in per request (``reasoning_effort``,
``reasoning.effort``, Anthropic ``thinking``, ``chat_template_kwargs.enable_thinking``).
Pending: DDTree acceptance with thinking on and off measured on a real Qwen3.6 pair on the GPU
(random-weight models cannot show it). Other families keep their template's own default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lucebox.engine.engines.kinds import EngineKind
from lucebox.engine.plan.enginechoice import KVFLASH_ARCHS

THINKING_OFF_ARCHS = (*KVFLASH_ARCHS, "qwen3", "deepseek4")
"""Every family the pinned Lucebox engine loads: there thinking is off unless asked."""
THINKING_OFF_REASON = (
    "off unless a request asks, on either engine: the Lucebox engine keeps it off "
    "(DDTree's draft acceptance falls with thinking on) and llama-server is made to match"
)


@dataclass(frozen=True)
class ChatDefaults:
    """How a model's chats are rendered, and whether it thinks when a request does not say."""

    template: str
    """``gguf`` (the model's own), ``builtin:<name>`` (an engine's), or ``chatml`` (the
    fallback llama-server gives a GGUF without one)."""
    thinking_default: bool | None
    """None: the template's own default (no engine differs for this family)."""
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "template": self.template,
            "thinking_default": self.thinking_default,
            "reason": self.reason,
        }


def thinking_default(arch: str) -> bool | None:
    """Whether ``arch`` thinks when a request does not say; None leaves it to its template."""
    return False if arch in THINKING_OFF_ARCHS else None


def chat_defaults(
    kind: EngineKind, arch: str, has_gguf_template: bool, named_template: str | None = None
) -> ChatDefaults:
    """What the plan prints for the launch's chats on ``kind`` (``named_template``: a
    preset's ``--chat-template`` for llama-server)."""
    thinking = thinking_default(arch)
    thinking_reason = THINKING_OFF_REASON if thinking is not None else "the template's own default"
    if kind.uses_builtin_chat_templates:
        template = f"builtin:{arch}"
        why = (
            "the Lucebox engine renders its families with built-in templates and ignores the "
            "GGUF's (llama-server uses the GGUF's own)"
        )
    elif named_template:
        template, why = f"builtin:{named_template}", "named by the preset"
    elif has_gguf_template:
        template, why = "gguf", "the model's own template"
    else:
        template, why = "chatml", "the GGUF has no template: llama-server's fallback"
    return ChatDefaults(template, thinking, f"template: {why}; thinking: {thinking_reason}")
