"""Agent transcripts (Claude Code JSONL) -> the chat messages each model call was sent.

A Claude Code session file holds one JSON record per line. ``user`` records carry a string or a
list of blocks (``text``, ``tool_result``); ``assistant`` records carry ``text``, ``tool_use`` and
``thinking`` blocks, often one block per record; every other record type (summaries, snapshots,
system notes) is skipped. The conversion is faithful: consecutive records of one role merge into
one turn, ``tool_use`` becomes an assistant ``tool_calls`` entry, ``tool_result`` a ``tool``
message with the matching id, and thinking is dropped. Every assistant turn is one model call,
made with exactly the messages before it.

Nothing here raises on bad input: a malformed line, an unknown block or a ``tool_result``
without its ``tool_use`` becomes a warning that names the line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]

_DROPPED_BLOCKS = frozenset({"thinking", "redacted_thinking"})


@dataclass(frozen=True)
class Transcript:
    messages: tuple[Message, ...]
    call_starts: tuple[int, ...]
    """For each model call, the number of messages before it: its prompt is ``messages[:n]``."""
    tool_names: tuple[str, ...]
    """Tools the session called, in first-use order."""
    warnings: tuple[str, ...]

    def prompt_of(self, call: int) -> list[Message]:
        return list(self.messages[: self.call_starts[call]])


def _tool_result_text(content: Any, line_no: int, warnings: list[str]) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return "" if content is None else json.dumps(content)
    parts = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        else:
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            warnings.append(f"line {line_no}: skipped a {kind!r} block inside a tool_result")
    return "\n".join(parts)


class _Builder:
    """Accumulates turns; one open turn per role so that consecutive records merge."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.call_starts: list[int] = []
        self.tool_names: list[str] = []
        self.warnings: list[str] = []
        self.open_calls: set[str] = set()

    def _last(self, role: str) -> Message | None:
        last = self.messages[-1] if self.messages else None
        return last if last is not None and last["role"] == role else None

    def add_user_text(self, text: str) -> None:
        last = self._last("user")
        if last is None:
            self.messages.append({"role": "user", "content": text})
        else:
            last["content"] = f"{last['content']}\n\n{text}"

    def add_assistant(self, text: str | None, call: dict[str, Any] | None) -> None:
        last = self._last("assistant")
        if last is None:
            self.call_starts.append(len(self.messages))
            last = {"role": "assistant", "content": None}
            self.messages.append(last)
        if text is not None:
            last["content"] = text if last["content"] is None else f"{last['content']}\n\n{text}"
        if call is not None:
            last.setdefault("tool_calls", []).append(call)

    def add_tool_result(self, call_id: str, text: str) -> None:
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": text})

    def user_record(self, content: Any, line_no: int) -> None:
        if isinstance(content, str):
            self.add_user_text(content)
            return
        if not isinstance(content, list):
            self.warnings.append(f"line {line_no}: user content is neither text nor blocks")
            return
        texts = []
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                texts.append(str(block.get("text", "")))
            elif kind == "tool_result":
                call_id = str(block.get("tool_use_id", ""))
                if call_id not in self.open_calls:
                    self.warnings.append(
                        f"line {line_no}: tool_result {call_id!r} has no tool_use before it; "
                        "skipped"
                    )
                    continue
                self.open_calls.discard(call_id)
                result = _tool_result_text(block.get("content"), line_no, self.warnings)
                self.add_tool_result(call_id, result)
            else:
                self.warnings.append(f"line {line_no}: skipped an unknown {kind!r} user block")
        # A tool message must follow its call directly, so text after results opens a new turn.
        if texts:
            self.add_user_text("\n\n".join(texts))

    def assistant_record(self, content: Any, line_no: int) -> None:
        if isinstance(content, str):
            self.add_assistant(content, None)
            return
        if not isinstance(content, list):
            self.warnings.append(f"line {line_no}: assistant content is neither text nor blocks")
            return
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                self.add_assistant(str(block.get("text", "")), None)
            elif kind == "tool_use":
                call_id, name = str(block.get("id", "")), str(block.get("name", ""))
                self.open_calls.add(call_id)
                if name not in self.tool_names:
                    self.tool_names.append(name)
                arguments = json.dumps(block.get("input", {}), ensure_ascii=False)
                self.add_assistant(
                    None,
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    },
                )
            elif kind not in _DROPPED_BLOCKS:
                self.warnings.append(f"line {line_no}: skipped an unknown {kind!r} assistant block")


def parse_transcript(lines: Iterable[str]) -> Transcript:
    """Convert the lines of a Claude Code JSONL session (pure; never raises on bad input)."""
    builder = _Builder()
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            builder.warnings.append(f"line {line_no}: not valid JSON; skipped")
            continue
        if not isinstance(record, dict):
            builder.warnings.append(f"line {line_no}: not a JSON object; skipped")
            continue
        kind = record.get("type")
        if kind not in ("user", "assistant"):
            continue
        message = record.get("message")
        if not isinstance(message, dict) or "content" not in message:
            builder.warnings.append(
                f"line {line_no}: {kind} record without message content; skipped"
            )
            continue
        if kind == "user":
            builder.user_record(message["content"], line_no)
        else:
            builder.assistant_record(message["content"], line_no)
    calls = builder.call_starts
    if calls and calls[0] == 0:
        builder.warnings.append("the transcript opens with an assistant turn; that call skipped")
        calls = calls[1:]
    return Transcript(
        tuple(builder.messages), tuple(calls), tuple(builder.tool_names), tuple(builder.warnings)
    )
