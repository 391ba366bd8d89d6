"""What a request body may be: hostile ones get a clear 4xx from the front, never a dropped
connection, and an honest client goes on being answered (the recorded-contract Lucebox
stand-in serves behind the front)."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from lucebox.engine.run.front.bodyguard import MAX_BODY_BYTES, body_refusal
from lucebox.engine.run.front.frontsetup import FrontSetup
from support.frontserver import loopback_policy, running_front
from tests.engine.run.test_front import lucebox_fake  # noqa: F401  (the fixture)


def _chat_with_image(url: str) -> bytes:
    part = {"type": "image_url", "image_url": {"url": url}}
    content = [{"type": "text", "text": "What is in it?"}, part]
    return json.dumps({"messages": [{"role": "user", "content": content}]}).encode()


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "http://169.254.169.254/latest/meta-data/",
        "http://[fe80::1]/x.png",
        "http://0.0.0.0/x.png",
        "ftp://example.com/x.png",
    ],
)
def test_an_image_on_this_machine_or_its_link_is_refused(url):
    refused = body_refusal(_chat_with_image(url))
    assert refused is not None and refused.status == 400
    assert "data: URL" in refused.message


def test_images_inline_or_from_the_web_and_other_bodies_go_on():
    assert body_refusal(_chat_with_image("data:image/png;base64,iVBORw0KGgo=")) is None
    assert body_refusal(_chat_with_image("https://example.com/cat.png")) is None
    assert body_refusal(_chat_with_image("http://127.0.0.1:8000/cat.png")) is None
    anthropic = {"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "file:///etc/shadow"}}]}]}  # fmt: skip
    refused = body_refusal(json.dumps(anthropic).encode())
    assert refused is not None and refused.status == 400
    assert body_refusal(b"not json at all") is None


def test_nesting_past_what_a_parser_follows_is_refused():
    for body in (b"[" * 5000 + b"]" * 5000, b'{"a":' * 3000 + b"1" + b"}" * 3000):
        refused = body_refusal(body)
        assert refused is not None and refused.status == 400 and "nests too deep" in refused.message


def test_too_many_messages_or_replies_are_refused_naming_the_limit():
    from lucebox.engine.run.front.bodyguard import MAX_CHOICES, MAX_MESSAGES

    many = [{"role": "user", "content": "hi"}] * (MAX_MESSAGES + 1)
    refused = body_refusal(json.dumps({"messages": many}).encode(), "/v1/chat/completions")
    assert refused is not None and refused.status == 400
    assert f"at most {MAX_MESSAGES:,} in one request" in refused.message
    one = [{"role": "user", "content": "hi"}]
    asked = {"messages": one, "n": MAX_CHOICES + 1}
    refused = body_refusal(json.dumps(asked).encode(), "/v1/chat/completions")
    assert refused is not None and f"at most {MAX_CHOICES} replies" in refused.message
    within = {"messages": one * MAX_MESSAGES, "n": MAX_CHOICES}
    assert body_refusal(json.dumps(within).encode(), "/v1/chat/completions") is None


def test_a_conversation_without_messages_or_an_image_to_a_text_model_is_the_clients_400():
    for path in ("/v1/chat/completions", "/v1/messages"):
        for body in (b"[[1]]", b'{"a": {"a": 1}}', b'{"messages": "hi"}', b'{"messages": []}'):
            refused = body_refusal(body, path)
            assert refused is not None and refused.status == 400, (path, body)
            assert "'messages' is required" in refused.message
    assert body_refusal(b'{"prompt": "hi"}', "/v1/completions") is None
    image = _chat_with_image("data:image/png;base64,iVBORw0KGgo=")
    assert body_refusal(image, "/v1/chat/completions") is None
    refused = body_refusal(image, "/v1/chat/completions", images=False)
    assert refused is not None and refused.status == 400 and "takes no images" in refused.message
    anthropic = {"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "data": "iVBO"}}]}]}  # fmt: skip
    text_only = body_refusal(json.dumps(anthropic).encode(), "/v1/messages", images=False)
    assert text_only is not None and text_only.status == 400
    # Codex's tools write JSON-schema types as lists and objects: not image parts.
    schema = {"type": "object", "properties": {"a": {"type": ["string", "null"]}, "b": {
        "type": {"nested": 1}}}}  # fmt: skip
    codex = {"input": [{"type": "message", "role": "user", "content": "hi"}],
             "tools": [{"type": "function", "name": "shell", "parameters": schema}]}  # fmt: skip
    assert body_refusal(json.dumps(codex).encode(), "/v1/responses", images=False) is None


def _raw_post(port: int, head: bytes, body: bytes = b"") -> bytes:
    """A request written on a socket as a client would, and what the front answers at once."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_the_front_answers_hostile_bodies_and_keeps_serving(lucebox_fake):  # noqa: F811
    spec = FrontSetup(loopback_policy(), "tiny", 4096)
    with running_front(spec, lucebox_fake) as running:
        port = int(running.url.rsplit(":", 1)[1])
        # Far past the limit: refused by its length before the body is sent at all.
        started = time.monotonic()
        big = MAX_BODY_BYTES * 2
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {big}\r\n\r\n"
        ).encode()
        answer = _raw_post(port, head)
        assert answer.startswith(b"HTTP/1.1 413") and b"at most" in answer
        assert time.monotonic() - started < 5
        with httpx.Client(timeout=60) as client:
            deep = client.post(
                f"{running.url}/v1/chat/completions",
                content=b"[" * 5000 + b"]" * 5000,
                headers={"content-type": "application/json"},
            )
            assert deep.status_code == 400 and "nests too deep" in deep.json()["error"]["message"]
            local = client.post(
                f"{running.url}/v1/chat/completions", content=_chat_with_image("file:///etc/passwd")
            )
            assert local.status_code == 400
            honest = client.post(
                f"{running.url}/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16},
            )
            assert honest.status_code == 200 and honest.json()["choices"]
