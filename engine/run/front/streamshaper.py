"""One streamed reply shaped: SSE bytes in any split, shaped SSE bytes out, with the usage
chunk, ``finish_reason``, deltas and Responses event fields clients need (:mod:`apishape`
lists what and why)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lucebox.engine.run.front.replycap import clamped
from lucebox.engine.run.front.shapecontext import (
    CHAT_PATH,
    MESSAGES_PATH,
    RESPONSES_PATH,
    ShapeContext,
    anthropic_id,
    api_endpoint,
    count_of,
    json_bytes,
    json_object,
)


class StreamShaper:
    """Shapes one streamed reply: SSE bytes in any split, shaped SSE bytes out."""

    def __init__(self, ctx: ShapeContext, request_body: bytes) -> None:
        self._ctx = ctx
        request = json_object(request_body) or {}
        options = request.get("stream_options")
        self._usage_asked = isinstance(options, dict) and options.get("include_usage") is True
        self._usage_sent = False
        self._last_chunk: dict[str, Any] = {}
        self._timings: dict[str, Any] = {}
        self._pending = b""
        self._sequence = 0
        self._item_ids: list[str] = []
        self._cap = _reply_cap(clamped(request, api_endpoint(ctx.path), ctx.reply_budget))
        self._held: dict[str, Any] | None = None
        """The Lucebox engine's closing chunk, held until its usage says whether the reply
        stopped at the cap."""

    def feed(self, chunk: bytes) -> bytes:
        """The shaped events completed by ``chunk``; a partial event waits for the rest."""
        self._pending = (self._pending + chunk).replace(b"\r\n", b"\n")
        *events, self._pending = self._pending.split(b"\n\n")
        return b"".join(self._event(event) for event in events)

    def close(self) -> bytes:
        """What is still owed when the engine's stream ends: a held closing chunk, then an
        event left without its blank line, as it came."""
        rest, self._pending = self._pending, b""
        return self._release(None) + rest

    def _release(self, completion_tokens: int | None) -> bytes:
        """The held closing chunk, its ``finish_reason`` ``length`` when the reply used every
        token the request allowed (the Lucebox engine says ``stop`` there when it streams)."""
        held, self._held = self._held, None
        if held is None:
            return b""
        if (
            completion_tokens is not None
            and self._cap is not None
            and completion_tokens >= self._cap
        ):
            choices = [
                {**c, "finish_reason": "length"} if c.get("finish_reason") == "stop" else c
                for c in held["choices"]
            ]
            held = {**held, "choices": choices}
        return b"data: " + json_bytes(held) + b"\n\n"

    def _event(self, event: bytes) -> bytes:
        raw = event + b"\n\n"
        lines = event.split(b"\n")
        data_at = [i for i, line in enumerate(lines) if line.startswith(b"data:")]
        if len(data_at) != 1:
            return raw
        payload = lines[data_at[0]][len(b"data:") :].strip()
        if payload == b"[DONE]":
            return self._release(None) + self._done() + raw
        doc = json_object(payload)
        if doc is None:
            return self._release(None) + raw
        released = self._release(count_of(_usage_of(doc).get("completion_tokens")))
        if self._holds(doc):
            self._held = self._chat_chunk(doc)
            return released
        shaped = self._shape(doc)
        if shaped is None:
            return released
        if shaped == doc:
            return released + raw
        lines[data_at[0]] = b"data: " + json_bytes(shaped)
        return released + b"\n".join(lines) + b"\n\n"

    def _holds(self, doc: dict[str, Any]) -> bool:
        """A Lucebox chat stream's closing chunk: its usage comes in the next one."""
        if not self._ctx.engine.streams_cap_as_stop or api_endpoint(self._ctx.path) != CHAT_PATH:
            return False
        choices = doc.get("choices")
        return (
            self._cap is not None
            and isinstance(choices, list)
            and any(isinstance(c, dict) and c.get("finish_reason") == "stop" for c in choices)
        )

    def _shape(self, doc: dict[str, Any]) -> dict[str, Any] | None:
        path = api_endpoint(self._ctx.path)
        if path == CHAT_PATH:
            return self._chat_chunk(doc)
        if path == MESSAGES_PATH:
            return _anthropic_event(doc)
        if path == RESPONSES_PATH:
            return self._responses_event(doc)
        return doc

    def _chat_chunk(self, doc: dict[str, Any]) -> dict[str, Any] | None:
        if isinstance(doc.get("timings"), dict):
            self._timings = doc["timings"]
        choices = doc.get("choices")
        if choices == [] and isinstance(doc.get("usage"), dict):
            if not self._usage_asked or self._usage_sent:
                return None
            self._usage_sent = True
            return doc
        if not isinstance(choices, list):
            return doc
        self._last_chunk = doc
        shaped = [_choice_without_null(choice) for choice in choices]
        return doc if shaped == choices else {**doc, "choices": shaped}

    def _done(self) -> bytes:
        """The usage chunk owed before ``[DONE]``: asked for, none sent, and the stream's
        ``timings`` say the counts (llama-server's names)."""
        if api_endpoint(self._ctx.path) != CHAT_PATH or not self._usage_asked or self._usage_sent:
            return b""
        usage = _usage_from_timings(self._timings)
        if usage is None:
            return b""
        self._usage_sent = True
        chunk: dict[str, Any] = {
            key: self._last_chunk[key]
            for key in ("id", "object", "created", "model")
            if key in self._last_chunk
        }
        return b"data: " + json_bytes({**chunk, "choices": [], "usage": usage}) + b"\n\n"

    def _responses_event(self, doc: dict[str, Any]) -> dict[str, Any]:
        shaped = {"sequence_number": self._sequence, **doc}
        self._sequence += 1
        item = doc.get("item")
        item_id = item.get("id") if isinstance(item, dict) else doc.get("item_id")
        if isinstance(item_id, str) and "output_index" not in doc:
            if item_id not in self._item_ids:
                self._item_ids.append(item_id)
            shaped["output_index"] = self._item_ids.index(item_id)
        kind = str(shaped.get("type", ""))
        if kind.startswith(("response.content_part.", "response.output_text.")):
            shaped.setdefault("content_index", 0)
        if kind in ("response.output_text.delta", "response.output_text.done"):
            shaped.setdefault("logprobs", [])
        return shaped


def _anthropic_event(doc: dict[str, Any]) -> dict[str, Any]:
    message = doc.get("message")
    if doc.get("type") != "message_start" or not isinstance(message, dict):
        return doc
    message_id = message.get("id")
    if not isinstance(message_id, str) or message_id.startswith("msg_"):
        return doc
    return {**doc, "message": {**message, "id": anthropic_id(message_id)}}


def _choice_without_null(choice: Any) -> Any:
    """A stream choice whose delta has no null content: the role's first delta gets "" (as
    OpenAI sends it), any other drops the key."""
    if not isinstance(choice, dict) or not isinstance(choice.get("delta"), dict):
        return choice
    delta = choice["delta"]
    if "role" in delta and delta.get("content") is None:
        return {**choice, "delta": {**delta, "content": ""}}
    if "content" in delta and delta["content"] is None:
        return {**choice, "delta": {k: v for k, v in delta.items() if k != "content"}}
    return choice


def _usage_from_timings(timings: Mapping[str, Any]) -> dict[str, Any] | None:
    prompt, cached, predicted = (
        count_of(timings.get(k)) for k in ("prompt_n", "cache_n", "predicted_n")
    )
    if prompt is None or predicted is None:
        return None
    cached_tokens = cached or 0
    prompt_tokens = prompt + cached_tokens
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": predicted,
        "total_tokens": prompt_tokens + predicted,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def _reply_cap(request: Mapping[str, Any]) -> int | None:
    """The reply tokens a chat request allows, where it says."""
    for key in ("max_completion_tokens", "max_tokens"):
        if (cap := count_of(request.get(key))) is not None:
            return cap
    return None


def _usage_of(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    usage = doc.get("usage")
    return usage if isinstance(usage, dict) else {}
