"""The API agents send, normalized where an engine lacks it: pure request and reply shaping.

lucebox's front door passes each request body through :func:`shape_request`, each JSON reply
through :func:`shape_response` and each SSE stream through one :class:`StreamShaper`
(:mod:`streamshaper`), so the same client sees the same API on llama-server and on the Lucebox
engine (``dflash_server``).
Bytes in, bytes out, no I/O; what nothing changes is passed on byte for byte.

What is normalized, and which engine lacks it (``reference/*-contract.md``, measured here):

- ``stream_options.include_usage``: one usage chunk before ``[DONE]`` when asked, none when
  not. The Lucebox engine ignores the option and always sends one (a chunk with empty
  ``choices`` that breaks clients reading ``choices[0]``); where an engine sends none although
  asked, one is made from the stream's ``timings``.
- Responses: input items with a role and no ``type`` are messages (llama-server refuses an
  assistant one with 400); reasoning items an engine cannot replay are dropped (llama-server
  refuses one without content, the Lucebox engine reads it as an empty user turn);
  ``text.format`` becomes ``response_format`` where the engine honours it (llama-server) and
  is dropped where it does not; fields no engine reads (``store``, ``include``, ...) are not
  passed on (llama-server copies unknown fields into its sampling parameters); a null
  ``reasoning`` is dropped (the Lucebox engine turns thinking on for any ``reasoning`` key).
  Stream events get the ``output_index``, ``content_index``, ``sequence_number`` and text
  ``logprobs`` an engine leaves out (the official SDK's models and stream helper need them).
- Anthropic: message ids are ``msg_...`` (llama-server sends ``chatcmpl-...``).
- Structured output: a JSON schema or JSON object asked of the Lucebox engine, which ignores
  ``response_format``, is refused (:func:`unsupported`), never answered with free text.
- ``finish_reason``: the Lucebox engine's stream says ``stop`` for a reply cut at the request's
  ``max_tokens`` (its non-streamed reply says ``length``); the closing chunk is held until the
  usage chunk after it says how many tokens, and says ``length`` there.
- No ``null`` content in OpenAI stream deltas (llama-server's first delta has one).
- Thinking: a request that does not say gets the model's planned default
  (:mod:`lucebox.engine.plan.chatdefaults`), set as ``chat_template_kwargs.enable_thinking``,
  which both engines read; an Anthropic ``thinking`` or a ``reasoning_effort`` the client sent
  is spelled the same way, so llama-server honours it as the Lucebox engine does.
- Sampling: a field a request leaves unset (``temperature``, ``top_p``, ``top_k``,
  ``min_p``) gets the served model's own default, decided once per launch
  (:mod:`lucebox.engine.plan.samplingdefaults`); the engines' own fallbacks differ
  (llama-server's flags, GGUF keys or built-ins; the Lucebox engine's model card or greedy).
- ``/v1/models``: one document on both engines, with ``context_length``
  (:func:`models_with_context`, which the front and a set's proxy answer with). Codex's
  request (``?client_version=``) gets Codex's own document, built by lucebox
  (:mod:`lucebox.engine.run.front.codexmodels`), never the Lucebox engine's, whose
  ``default_reasoning_level`` would turn thinking on for Codex on that engine alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lucebox.engine.engines import kinds
from lucebox.engine.run.front.replycap import clamped
from lucebox.engine.run.front.shapecontext import (
    CHAT_PATH,
    MESSAGES_PATH,
    RESPONSES_PATH,
    SHAPED_PATHS,
    ShapeContext,
    anthropic_id,
    api_endpoint,
    json_bytes,
    json_object,
)
from lucebox.engine.run.front.streamshaper import StreamShaper

if TYPE_CHECKING:
    from lucebox.engine.engines.kinds import EngineKind
    from lucebox.engine.engines.registry import KindName
    from lucebox.engine.plan.samplingdefaults import SamplingDefaults

RESPONSES_UNREAD = (
    "store",
    "include",
    "prompt_cache_key",
    "service_tier",
    "client_metadata",
    "metadata",
    "safety_identifier",
    "user",
    "truncation",
    "background",
    "top_logprobs",
)
"""Responses fields neither engine reads; llama-server would copy them into its sampling
parameters (``top_logprobs`` without ``logprobs`` is a 400 there)."""


def shape_request(ctx: ShapeContext, body: bytes) -> bytes:
    """The request body the engine gets; a body that is not a JSON object passes unchanged
    (the engine answers it as it would)."""
    doc = json_object(body)
    endpoint = api_endpoint(ctx.path)
    if endpoint not in SHAPED_PATHS or doc is None:
        return body
    shaped = _with_thinking(clamped(doc, endpoint, ctx.reply_budget), ctx.thinking_default)
    if ctx.sampling is not None:
        shaped = ctx.sampling.filled(shaped)
    if "reasoning" in shaped and shaped["reasoning"] is None:
        # The Lucebox engine turns thinking on for any "reasoning" key, null too.
        shaped = {k: v for k, v in shaped.items() if k != "reasoning"}
    if endpoint == RESPONSES_PATH:
        shaped = _responses_request(ctx.engine, shaped)
    return body if shaped == doc else json_bytes(shaped)


STRUCTURED_TYPES = ("json_schema", "json_object")


def unsupported(ctx: ShapeContext, body: bytes) -> str | None:
    """Why the serving engine cannot do what the request asks, where relaying it would answer
    something else in silence; None when it can. The Lucebox engine does not constrain a reply
    to JSON (``response_format`` is not implemented there), so a JSON schema or JSON object
    asked of it is refused rather than answered with free text."""
    if ctx.engine.honours_response_format:
        return None
    doc = json_object(body)
    if doc is None:
        return None
    endpoint = api_endpoint(ctx.path)
    fmt: Any = None
    if endpoint == CHAT_PATH:
        fmt = doc.get("response_format")
    elif endpoint == RESPONSES_PATH:
        text = doc.get("text")
        fmt = text.get("format") if isinstance(text, dict) else None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in STRUCTURED_TYPES:
        return None
    return (
        f"{ctx.engine.title} serving this model cannot constrain a reply to {kind} "
        "(response_format is not implemented there): ask without it, or serve the model on "
        f"an engine that honours it ({_honouring()})"
    )


def _honouring() -> str:
    """How to serve on the engines that honour ``response_format``."""
    honour = [k for k in kinds.KINDS.values() if k.honours_response_format]
    return ", ".join(f"`lucebox serve --engine {k.name}`" for k in honour)


def shape_response(ctx: ShapeContext, status: int, body: bytes) -> bytes:
    """The JSON reply the client gets (an error, or a body that is not JSON, passes);
    ``/v1/models`` is lucebox's own document for the served model."""
    doc = json_object(body)
    endpoint = api_endpoint(ctx.path)
    if status != 200 or doc is None:
        return body
    if endpoint != MESSAGES_PATH:
        return body
    message_id = doc.get("id")
    if not isinstance(message_id, str) or message_id.startswith("msg_"):
        return body
    return json_bytes({**doc, "id": anthropic_id(message_id)})


def models_with_context(
    listed: object, context_by_model: Mapping[str, int], created_s: int
) -> dict[str, Any]:
    """``/v1/models`` as clients get it on both engines: the engine's document, its own keys
    kept (llama-server's ``meta``, a router's ``status``: its web UI reads them), each served
    model with its planned ``context_length`` (what Open WebUI and agents read for the window;
    llama-server's has none) and the OpenAI keys an engine leaves out. A served model the
    engine does not list is added."""
    document = dict(listed) if isinstance(listed, dict) else {}
    data = document.get("data")
    entries = [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []
    listed_ids = {m.get("id") for m in entries}
    entries += [{"id": m} for m in context_by_model if m not in listed_ids]
    shaped = []
    for entry in entries:
        model_id = entry.get("id")
        entry = {"object": "model", "created": created_s, "owned_by": "lucebox", **entry}
        if isinstance(model_id, str) and model_id in context_by_model:
            entry["context_length"] = context_by_model[model_id]
        shaped.append(entry)
    return {**document, "object": "list", "data": shaped}


def _asked_thinking(doc: Mapping[str, Any]) -> bool | None:
    """Whether the request asks for thinking, in any spelling both engines know; None when it
    does not say."""
    kwargs = doc.get("chat_template_kwargs")
    if isinstance(kwargs, dict) and isinstance(kwargs.get("enable_thinking"), bool):
        return bool(kwargs["enable_thinking"])
    thinking = doc.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "disabled"):
        return bool(thinking["type"] == "enabled")
    reasoning = doc.get("reasoning")
    if isinstance(reasoning, dict):
        return reasoning.get("effort") != "none"
    effort = doc.get("reasoning_effort")
    if isinstance(effort, str):
        return effort != "none"
    return None


def _with_thinking(doc: dict[str, Any], default: bool | None) -> dict[str, Any]:
    asked = _asked_thinking(doc)
    wanted = default if asked is None else asked
    kwargs = doc.get("chat_template_kwargs")
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    if wanted is None or kwargs.get("enable_thinking") is wanted:
        return doc
    return {**doc, "chat_template_kwargs": {**kwargs, "enable_thinking": wanted}}


def _responses_request(engine: EngineKind, doc: dict[str, Any]) -> dict[str, Any]:
    shaped = {k: v for k, v in doc.items() if k not in RESPONSES_UNREAD and k != "text"}
    response_format = _response_format(doc.get("text"))
    if engine.honours_response_format and response_format is not None:
        shaped.setdefault("response_format", response_format)
    items = doc.get("input")
    if isinstance(items, list):
        shaped["input"] = [_typed_item(item) for item in items if not _unreplayable(engine, item)]
    return shaped


def _typed_item(item: Any) -> Any:
    """A role-and-content item without ``type`` is a message (the Responses API's easy form)."""
    if isinstance(item, dict) and "type" not in item and "role" in item:
        return {**item, "type": "message"}
    return item


def _unreplayable(engine: EngineKind, item: Any) -> bool:
    """A reasoning item the engine cannot take back: any on an engine that replays none, one
    without reasoning text on one that does."""
    if not isinstance(item, dict) or item.get("type") != "reasoning":
        return False
    if not engine.replays_reasoning:
        return True
    content = item.get("content")
    first = content[0] if isinstance(content, list) and content else None
    return not (isinstance(first, dict) and isinstance(first.get("text"), str))


def _response_format(text: Any) -> dict[str, Any] | None:
    """Chat Completions' ``response_format`` for a Responses ``text.format``."""
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") != "json_schema":
        return None
    schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"type": "json_schema", "json_schema": schema}


@dataclass(frozen=True)
class Shapes:
    """These normalizations behind lucebox's front (its ``frontwire.ApiShape`` hook), for the
    one model a launch serves."""

    engine: KindName
    model_id: str
    context_length: int
    thinking_default: bool | None
    sampling: SamplingDefaults | None = None
    reply_budget: int | None = None
    """The most reply tokens the plan serves a request; a client's larger limit is clamped."""

    def _ctx(self, path: str) -> ShapeContext:
        return ShapeContext(
            kinds.kind(self.engine),
            path,
            self.model_id,
            self.context_length,
            self.thinking_default,
            self.sampling,
            self.reply_budget,
        )

    def request(self, path: str, body: bytes) -> bytes:
        return shape_request(self._ctx(path), body)

    def unsupported(self, path: str, body: bytes) -> str | None:
        return unsupported(self._ctx(path), body)

    def reply(self, path: str, status: int, body: bytes) -> bytes:
        return shape_response(self._ctx(path), status, body)

    def stream(self, path: str, request: bytes) -> StreamShaper:
        return StreamShaper(self._ctx(path), request)
