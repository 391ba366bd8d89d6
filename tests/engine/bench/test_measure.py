"""A measured streamed call against a real local HTTP server that speaks a minimal
OpenAI-compatible SSE stream without `usage` or `timings` (some servers send neither)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lucebox.engine.bench.measure import streamed_call
from lucebox.engine.core.api import CallError


def _chunk(delta: dict) -> bytes:
    return f"data: {json.dumps({'choices': [{'index': 0, 'delta': delta}]})}\n\n".encode()


REPLIES = {
    "/text/v1/chat/completions": (200, [_chunk({"content": p}) for p in ("He", "llo", " you")]),
    "/tool/v1/chat/completions": (
        200,
        [
            _chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "Read"}}]}),
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
        ],
    ),
    "/empty/v1/chat/completions": (200, [_chunk({"content": ""})]),
    "/refuse/v1/chat/completions": (400, [b'{"error": {"message": "too long"}}']),
}


@pytest.fixture
def server() -> Iterator[str]:
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            status, parts = REPLIES[self.path]
            self.send_response(status)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for part in parts:
                self.wfile.write(part)
                self.wfile.flush()
            if status == 200:
                self.wfile.write(b"data: [DONE]\n\n")

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    assert all(body["stream"] and body["stream_options"]["include_usage"] for body in seen)


def test_without_usage_the_streamed_pieces_are_counted(server):
    sample = streamed_call(f"{server}/text", {"messages": []}, {})
    assert sample.text == "Hello you" and not sample.empty
    assert sample.completion_tokens == 3 and sample.prompt_tokens is None
    assert sample.decode_tok_s is not None and sample.decode_tok_s > 0
    assert 0 < sample.ttft_s <= sample.wall_s


def test_a_tool_call_is_a_reply_and_nothing_is_empty(server):
    tool = streamed_call(f"{server}/tool", {"messages": []}, {})
    assert tool.tool_calls == 1 and not tool.empty
    empty = streamed_call(f"{server}/empty", {"messages": []}, {})
    assert empty.empty and empty.ttft_s == pytest.approx(empty.wall_s, abs=0.05)


def test_a_refusal_names_the_status_and_the_reason(server):
    with pytest.raises(CallError, match=r"400.*too long"):
        streamed_call(f"{server}/refuse", {"messages": []}, {})
