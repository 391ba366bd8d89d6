"""apishape against the real llama-server (the built CPU engine serving SmolLM2): each request
is sent as the engine gets it without shaping (proving what it lacks) and through lucebox's
front with the shapes serverrun gives it, read by the official `openai` and `anthropic` SDKs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from lucebox.engine.engines.kinds import LLAMA_SERVER
from lucebox.engine.run.front.apishape import (
    Shapes,
    shape_request,
)
from lucebox.engine.run.front.frontsetup import FrontSetup
from lucebox.engine.run.front.shapecontext import ShapeContext
from lucebox.engine.run.front.streamshaper import StreamShaper
from support.engineserver import RunningServer, running_server
from support.frontserver import RunningFront, loopback_policy, running_front
from tests.conftest import run_lucebox

pytestmark = pytest.mark.slow

ALIAS = "smol"


@pytest.fixture(scope="module")
def server(built_engine_home: Path) -> Iterator[RunningServer]:
    from support.realmodels import smol_model

    path = run_lucebox("engine", "path", env={"LUCEBOX_HOME": str(built_engine_home)})
    assert path.returncode == 0, path.stderr
    with running_server(
        Path(path.stdout.strip()), smol_model(), ["--jinja", "--alias", ALIAS]
    ) as running:
        yield running


@pytest.fixture(scope="module")
def front(server: RunningServer) -> Iterator[RunningFront]:
    """lucebox's front before the engine, shaping as serverrun has it shape."""
    spec = FrontSetup(loopback_policy(), ALIAS, 2048)
    shape = Shapes("llama-server", ALIAS, 2048, thinking_default=False)
    with running_front(spec, server.url, shape) as running:
        yield running


@pytest.fixture
def oai(front):
    with openai.OpenAI(
        base_url=f"{front.url}/v1", api_key="none", max_retries=0, timeout=300
    ) as client:
        yield client


@pytest.fixture
def claude(front):
    with anthropic.Anthropic(
        base_url=front.url, api_key="none", max_retries=0, timeout=300
    ) as client:
        yield client


def raw_post(server: RunningServer, path: str, body: dict[str, Any]) -> httpx.Response:
    """What the engine answers without shaping."""
    return httpx.post(
        f"{server.url}{path}", json=body, headers={"connection": "close"}, timeout=300
    )


def raw_stream(server: RunningServer, path: str, body: dict[str, Any]) -> bytes:
    with httpx.Client(timeout=300) as client:
        return client.post(f"{server.url}{path}", json=body).read()


CODEX_INPUT = [
    {"role": "user", "content": "Say hi."},
    {"type": "reasoning", "summary": [], "encrypted_content": None},
    {"role": "assistant", "content": [{"type": "output_text", "text": "Hi!"}]},
    {"role": "user", "content": "Say bye."},
]
CODEX_FIELDS = {
    "instructions": "Be brief.",
    "tools": [],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "session-1",
}


def test_responses_multi_turn_without_type_accepted_through_shape_request(server, oai):
    plain = [CODEX_INPUT[0], CODEX_INPUT[2], CODEX_INPUT[3]]
    refused = raw_post(server, "/v1/responses", {"input": plain, "max_output_tokens": 4})
    assert refused.status_code == 400, refused.text
    assert "Cannot determine type" in refused.text
    ctx = ShapeContext(LLAMA_SERVER, "/v1/responses", ALIAS, 2048, False)
    body = shape_request(ctx, json.dumps({"input": plain, "max_output_tokens": 4}).encode())
    accepted = httpx.post(f"{server.url}/v1/responses", content=body, timeout=300)
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["output"][0]["content"][0]["text"]


def test_a_codex_turn_is_accepted(server, oai):
    refused = raw_post(
        server, "/v1/responses", {"input": CODEX_INPUT, "max_output_tokens": 4, **CODEX_FIELDS}
    )
    assert refused.status_code == 400, refused.text
    reply = oai.responses.create(
        model=ALIAS,
        input=CODEX_INPUT,
        max_output_tokens=4,
        **CODEX_FIELDS,
    )
    assert reply.status == "completed" and reply.output_text


def test_text_format_is_honoured(server, oai):
    ask = "Give a JSON object with key a."
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    text = {"format": {"type": "json_schema", "name": "answer", "schema": schema}}
    # Greedy both ways: a sampled reply may open with a brace by chance.
    asked = {"input": ask, "max_output_tokens": 8, "text": text, "temperature": 0}
    ignored = raw_post(server, "/v1/responses", asked).json()
    assert not ignored["output"][0]["content"][0]["text"].lstrip().startswith("{")
    reply = oai.responses.create(
        model=ALIAS, input=ask, max_output_tokens=8, text=text, temperature=0
    )
    assert reply.output_text.lstrip().startswith("{")


def test_responses_stream_helper_works(server, oai):
    # Unshaped, the helper fails on the events' missing output_index (a list index of None).
    with (
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0) as raw,
        pytest.raises(TypeError),
        raw.responses.stream(model=ALIAS, input="Say hi.", max_output_tokens=4) as stream,
    ):
        list(stream)
    with oai.responses.stream(model=ALIAS, input="Say hi.", max_output_tokens=4) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text and final.output_text


def test_stream_deltas_have_no_null_content(server, oai):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True}
    assert b'"content":null' in raw_stream(server, "/v1/chat/completions", body)
    chunks = list(
        oai.chat.completions.create(
            model=ALIAS, messages=body["messages"], max_tokens=4, stream=True
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant" and deltas[0].content == ""
    assert all(isinstance(d.content, str) for d in deltas if "content" in d.model_fields_set)
    assert all(c.usage is None for c in chunks)


def test_usage_chunk_when_asked_never_twice(server, oai):
    messages = [{"role": "user", "content": "Hi"}]
    chunks = list(
        oai.chat.completions.create(
            model=ALIAS,
            messages=messages,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1 and chunks[-1].usage is usage[0] and chunks[-1].choices == []
    # An engine that sends no usage chunk: llama-server's own stream when not asked, shaped
    # as if asked, gets one from its timings with the counts the engine gives when asked.
    plain = {"messages": messages, "max_tokens": 4, "stream": True}
    raw = raw_stream(server, "/v1/chat/completions", plain)
    ctx = ShapeContext(LLAMA_SERVER, "/v1/chat/completions", ALIAS, 2048, None)
    shaper = StreamShaper(
        ctx, json.dumps({**plain, "stream_options": {"include_usage": True}}).encode()
    )
    shaped = shaper.feed(raw) + shaper.close()
    data = [line[6:] for line in shaped.decode().splitlines() if line.startswith("data: ")]
    made = json.loads(data[-2])
    assert data[-1] == "[DONE]" and made["choices"] == []
    assert made["usage"]["prompt_tokens"] == usage[0].prompt_tokens
    assert made["usage"]["completion_tokens"] == usage[0].completion_tokens == 4


def test_anthropic_message_ids(server, claude):
    body = {"model": ALIAS, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    assert raw_post(server, "/v1/messages", body).json()["id"].startswith("chatcmpl-")
    message = claude.messages.create(**body)
    assert message.id.startswith("msg_") and message.content
    with claude.messages.stream(**body) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.id.startswith("msg_") and text


def test_qwen_template_thinks_by_default_on_llama_server_unless_shaped(built_engine_home):
    """llama-server follows a Qwen3.5 template's default (thinking on) where the Lucebox engine
    keeps thinking off: shaped with the family's planned default, both render it off, and a
    client's ask turns it on in every spelling."""
    source = run_lucebox("engine", "source", "--json", env={"LUCEBOX_HOME": str(built_engine_home)})
    assert source.returncode == 0, source.stderr
    template = Path(json.loads(source.stdout)["path"]) / "models/templates/Qwen3.5-4B.jinja"
    from support.realmodels import smol_model

    engine = run_lucebox("engine", "path", env={"LUCEBOX_HOME": str(built_engine_home)})
    args = ["--jinja", "--chat-template-file", str(template)]
    with running_server(Path(engine.stdout.strip()), smol_model(), args) as qwen:

        def rendered(path: str, body: dict[str, Any], default: bool | None) -> str:
            ctx = ShapeContext(LLAMA_SERVER, path, ALIAS, 2048, default)
            shaped = shape_request(ctx, json.dumps(body).encode())
            reply = httpx.post(f"{qwen.url}/apply-template", content=shaped, timeout=120)
            assert reply.status_code == 200, reply.text
            prompt: str = reply.json()["prompt"]
            return prompt

        chat = {"messages": [{"role": "user", "content": "Hi"}]}
        thinking_on, thinking_off = "<think>\n", "<think>\n\n</think>\n\n"
        assert rendered("/health", chat, False).endswith(thinking_on)  # not shaped
        assert rendered("/v1/chat/completions", chat, False).endswith(thinking_off)
        asks: list[tuple[str, dict[str, Any]]] = [
            ("/v1/chat/completions", {"reasoning_effort": "high"}),
            ("/v1/messages", {"thinking": {"type": "enabled", "budget_tokens": 64}}),
            ("/v1/responses", {"reasoning": {"effort": "low"}}),
        ]
        for path, ask in asks:
            assert rendered(path, {**chat, **ask}, False).endswith(thinking_on), ask


def test_models_list_names_the_model_with_its_context(server, oai):
    raw = httpx.get(f"{server.url}/v1/models", timeout=30).json()
    assert "context_length" not in raw["data"][0]
    models = list(oai.models.list())
    assert [m.id for m in models] == [ALIAS]
    extra = models[0].model_extra or {}
    # The planned context beside llama-server's own keys (its meta, aliases), kept for clients.
    assert extra["context_length"] == 2048 and extra["meta"] == raw["data"][0]["meta"]
