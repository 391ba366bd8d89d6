"""apishape against the Lucebox engine's shapes: the stream and reply recorded from the real
engine on the H100 (tests/engine/fixtures/lucebox/, what support/luceboxfake.py replays) and the
Anthropic and Responses events its source writes (sse_emitter.cpp at the pinned commit; see
reference/lucebox-engine-contract.md); the client-visible result is read with the official
SDKs' models. llama-server's shapes are recorded live in test_apishape_llama.py."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic.types
import openai
import pytest
from openai.types import Model
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam
from pydantic import TypeAdapter

from lucebox.engine.engines import kinds
from lucebox.engine.engines.registry import KindName
from lucebox.engine.run.front.apishape import (
    Shapes,
    models_with_context,
    shape_request,
    shape_response,
    unsupported,
)
from lucebox.engine.run.front.frontsetup import FrontSetup
from lucebox.engine.run.front.shapecontext import ShapeContext
from lucebox.engine.run.front.streamshaper import StreamShaper
from support import luceboxfake
from support.frontserver import loopback_policy, running_front
from support.health import wait_healthy
from support.ports import free_port

FIXTURES = Path(__file__).parents[1] / "fixtures" / "lucebox"
FAKE = Path(luceboxfake.__file__)
STREAM = (FIXTURES / "plain.stream.txt").read_bytes()
REPLY = (FIXTURES / "plain.reply.json").read_bytes()


def ctx(path: str, engine: KindName = "lucebox", thinking: bool | None = False) -> ShapeContext:
    return ShapeContext(kinds.kind(engine), path, "tiny", 4096, thinking)


def shaped_stream(context: ShapeContext, request: dict, stream: bytes, seed: int = 0) -> bytes:
    """``stream`` through one shaper in random splits (one byte at a time among them)."""
    shaper = StreamShaper(context, json.dumps(request).encode())
    rng, out, at = random.Random(seed), [], 0
    while at < len(stream):
        step = rng.choice((1, 2, 7, 64, 500))
        out.append(shaper.feed(stream[at : at + step]))
        at += step
    out.append(shaper.close())
    return b"".join(out)


def data_of(stream: bytes) -> list[str]:
    return [
        line[len("data: ") :] for line in stream.decode().splitlines() if line.startswith("data: ")
    ]


def chunks_of(stream: bytes) -> list[ChatCompletionChunk]:
    data = data_of(stream)
    assert data[-1] == "[DONE]"
    return [ChatCompletionChunk.model_validate_json(item) for item in data[:-1]]


CHAT = "/v1/chat/completions"
ASK_USAGE = {"messages": [], "stream": True, "stream_options": {"include_usage": True}}


@pytest.mark.parametrize("seed", range(3))
def test_lucebox_usage_chunk_only_when_asked(seed):
    # The engine sends its usage chunk (empty choices) whatever the request says.
    assert any(json.loads(d).get("choices") == [] for d in data_of(STREAM)[:-1])
    plain = chunks_of(shaped_stream(ctx(CHAT), {"messages": [], "stream": True}, STREAM, seed))
    assert all(chunk.choices and chunk.usage is None for chunk in plain)
    asked = chunks_of(shaped_stream(ctx(CHAT), ASK_USAGE, STREAM, seed))
    usage = [chunk for chunk in asked if chunk.usage is not None]
    assert len(usage) == 1 and usage[0] is asked[-1] and usage[0].choices == []
    counts = usage[0].usage
    assert counts is not None and (counts.prompt_tokens, counts.completion_tokens) == (40, 16)
    text = "".join(c.choices[0].delta.content or "" for c in plain)
    raw = "".join(
        (json.loads(d)["choices"] or [{"delta": {}}])[0]["delta"].get("content") or ""
        for d in data_of(STREAM)[:-1]
    )
    assert text == raw


@pytest.mark.parametrize("seed", range(3))
def test_a_lucebox_stream_cut_at_max_tokens_ends_with_length(seed):
    """The engine's stream says "stop" for a reply cut at the cap (its whole reply says
    "length"); the usage chunk after the closing one says 16 tokens."""
    for max_tokens, reason in ((16, "length"), (3, "length"), (256, "stop"), (None, "stop")):
        request: dict = {"messages": [], "stream": True}
        if max_tokens is not None:
            request["max_tokens"] = max_tokens
        chunks = chunks_of(shaped_stream(ctx(CHAT), request, STREAM, seed))
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == reason
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text.strip()  # nothing held back is lost
    # llama-server says "length" itself: its stream is not held or changed.
    llama = chunks_of(shaped_stream(ctx(CHAT, "llama-server"), {"max_tokens": 16}, STREAM, seed))
    assert [c.choices[0].finish_reason for c in llama if c.choices][-1] == "stop"


def test_structured_output_the_lucebox_engine_cannot_constrain_is_refused():
    schema = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    chat = json.dumps({"messages": [], "response_format": schema}).encode()
    responses = json.dumps({"input": "x", "text": {"format": {"type": "json_object"}}}).encode()
    why = unsupported(ctx(CHAT), chat)
    assert why is not None and "json_schema" in why and "--engine llama-server" in why
    assert unsupported(ctx("/v1/responses"), responses) is not None
    assert unsupported(ctx(CHAT, "llama-server"), chat) is None  # it honours a schema
    plain = json.dumps({"messages": [], "response_format": {"type": "text"}}).encode()
    assert unsupported(ctx(CHAT), plain) is None
    assert unsupported(ctx(CHAT), b"not json") is None


def test_lucebox_first_delta_gets_empty_content():
    chunks = chunks_of(shaped_stream(ctx(CHAT), {"stream": True}, STREAM))
    first = json.loads(data_of(shaped_stream(ctx(CHAT), {"stream": True}, STREAM))[0])
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(
        isinstance(c.choices[0].delta.content, str)
        for c in chunks
        if "content" in c.choices[0].delta.model_fields_set
    )


def test_unchanged_events_and_replies_pass_byte_for_byte():
    asked = shaped_stream(ctx(CHAT), ASK_USAGE, STREAM)
    assert asked.split(b"\n\n")[1:] == STREAM.split(b"\n\n")[1:]
    assert shape_response(ctx(CHAT), 200, REPLY) is REPLY
    assert shape_response(ctx("/v1/messages"), 400, b'{"id":"x"}') == b'{"id":"x"}'
    assert shape_request(ctx("/health"), b"{}") == b"{}"
    assert shape_request(ctx(CHAT), b"not json") == b"not json"


def test_usage_made_from_timings_when_the_engine_sends_none():
    finish = {
        "choices": [{"delta": {}, "finish_reason": "stop", "index": 0}],
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "timings": {"prompt_n": 1, "cache_n": 30, "predicted_n": 3},
    }
    stream = f"data: {json.dumps(finish)}\n\ndata: [DONE]\n\n".encode()
    chunks = chunks_of(shaped_stream(ctx(CHAT, "llama-server"), ASK_USAGE, stream))
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert chunks[-1].choices == [] and chunks[-1].id == "chatcmpl-1"
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (31, 3, 34)
    assert usage.prompt_tokens_details.cached_tokens == 30
    plain = shaped_stream(ctx(CHAT, "llama-server"), {"stream": True}, stream)
    assert plain == stream


# The Lucebox engine's Anthropic and Responses events, as sse_emitter.cpp writes them.
LUCEBOX_ANTHROPIC = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_0000000000000002",'
    b'"type":"message","role":"assistant","model":"tiny","content":[],"stop_reason":null,'
    b'"stop_sequence":null,"usage":{"input_tokens":9,"output_tokens":0}}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    b'"content_block":{"type":"text","text":""}}\n\n'
)
LUCEBOX_RESPONSES = (
    b'event: response.created\ndata: {"type":"response.created","response":{"id":'
    b'"resp_0000000000000004","object":"response","created_at":1,"status":"in_progress",'
    b'"model":"tiny"}}\n\n'
    b'event: response.output_item.added\ndata: {"type":"response.output_item.added",'
    b'"output_index":0,"item":{"type":"message","id":"item_1","status":"in_progress",'
    b'"role":"assistant","content":[]}}\n\n'
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
    b'"item_id":"item_1","output_index":0,"content_index":0,"delta":"Hi"}\n\n'
)


def test_lucebox_anthropic_ids_stay_and_responses_events_validate():
    events = shaped_stream(ctx("/v1/messages"), {}, LUCEBOX_ANTHROPIC)
    assert events == LUCEBOX_ANTHROPIC
    start = anthropic.types.RawMessageStartEvent.model_validate_json(data_of(events)[0])
    assert start.message.id.startswith("msg_")
    adapter = TypeAdapter(anthropic.types.RawMessageStreamEvent)
    assert [adapter.validate_json(d).type for d in data_of(events)] == [
        "message_start",
        "content_block_start",
    ]
    from openai.types.responses import ResponseStreamEvent

    responses = data_of(shaped_stream(ctx("/v1/responses"), {}, LUCEBOX_RESPONSES))
    kinds = [TypeAdapter(ResponseStreamEvent).validate_json(d) for d in responses[1:]]
    assert [e.sequence_number for e in kinds] == [1, 2]


def test_anthropic_ids_become_msg_ids():
    for path in ("/v1/messages", "/messages"):
        reply = shape_response(ctx(path, "llama-server"), 200, b'{"id":"chatcmpl-Ab1"}')
        assert json.loads(reply)["id"] == "msg_Ab1"
    start = b'data: {"type":"message_start","message":{"id":"chatcmpl-Ab1"}}\n\n'
    out = shaped_stream(ctx("/v1/messages", "llama-server"), {}, start)
    assert json.loads(data_of(out)[0])["message"]["id"] == "msg_Ab1"


CODEX_TURN = {
    "model": "m",
    "instructions": "Be brief.",
    "input": [
        {"role": "user", "content": "Hi"},
        {"type": "reasoning", "summary": [], "encrypted_content": None},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"role": "user", "content": "Bye"},
    ],
    "tools": [],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": None,
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "k",
    "text": {"verbosity": "low", "format": {"type": "json_schema", "name": "o", "schema": {}}},
}


@pytest.mark.parametrize("engine", ["llama-server", "lucebox"])
def test_codex_turn_is_shaped_for_each_engine(engine):
    context = ctx("/v1/responses", engine)
    shaped = json.loads(shape_request(context, json.dumps(CODEX_TURN).encode()))
    items = shaped["input"]
    assert [item.get("type") for item in items] == [
        "message",
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    for field in ("store", "include", "prompt_cache_key", "text", "reasoning"):
        assert field not in shaped
    assert shaped["parallel_tool_calls"] is False and shaped["tool_choice"] == "auto"
    assert shaped["chat_template_kwargs"] == {"enable_thinking": False}
    if engine == "llama-server":
        assert shaped["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "o", "schema": {}},
        }
    else:
        assert "response_format" not in shaped


def test_reasoning_with_text_is_kept_for_llama_server_only():
    item = {
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": "t"}],
    }
    body = json.dumps({"input": [item, {"role": "user", "content": "x"}]}).encode()
    kept = json.loads(shape_request(ctx("/v1/responses", "llama-server", None), body))
    dropped = json.loads(shape_request(ctx("/v1/responses", "lucebox", None), body))
    assert kept["input"][0] == item and len(dropped["input"]) == 1


@pytest.mark.parametrize(
    ("body", "default", "wanted"),
    [
        ({}, False, False),
        ({}, True, True),
        ({}, None, None),
        ({"chat_template_kwargs": {"enable_thinking": True}}, False, True),
        ({"reasoning_effort": "high"}, False, True),
        ({"reasoning_effort": "none"}, True, False),
        ({"reasoning": {"effort": "low"}}, False, True),
        ({"reasoning": None}, False, False),
        ({"thinking": {"type": "enabled", "budget_tokens": 100}}, None, True),
        ({"thinking": {"type": "disabled"}}, True, False),
    ],
)
def test_thinking_is_spelled_one_way_for_both_engines(body, default, wanted):
    for path in (CHAT, "/v1/messages", "/v1/responses"):
        shaped = json.loads(
            shape_request(ctx(path, "llama-server", default), json.dumps(body).encode())
        )
        kwargs = shaped.get("chat_template_kwargs", {})
        assert kwargs.get("enable_thinking") == wanted
        assert "reasoning" not in shaped or shaped["reasoning"] is not None


def test_the_models_list_validates_keeps_the_engines_keys_and_carries_context():
    engine = {"object": "list", "data": [{"id": "smol", "meta": {"n_ctx_train": 8192}}]}
    doc = models_with_context(engine, {"qwen3.6-27b": 65536, "smol": 4096}, created_s=5)
    models = [Model.model_validate(entry) for entry in doc["data"]]
    assert [m.id for m in models] == ["smol", "qwen3.6-27b"]
    assert [entry["context_length"] for entry in doc["data"]] == [4096, 65536]
    assert doc["data"][0]["meta"] == {"n_ctx_train": 8192} and doc["object"] == "list"
    assert models_with_context(None, {"tiny": 2048}, 5)["data"][0]["id"] == "tiny"


@pytest.fixture
def fake_engine(tmp_path: Path) -> Iterator[str]:
    """support/luceboxfake.py serving the recorded replies, as the engine would on ``port``."""
    port = free_port()
    env = {"FAKE_REQUESTS": str(tmp_path / "requests.txt"), "PATH": ""}
    argv = [sys.executable, str(FAKE), str(tmp_path / "m.gguf"), "--port", str(port)]
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 30, proc, interval_s=0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_sdk_stream_over_the_lucebox_engine_fake(fake_engine):
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hi"}]
    with (
        openai.OpenAI(base_url=f"{fake_engine}/v1", api_key="none", max_retries=0) as raw,
        pytest.raises(IndexError),  # a client reading choices[0] meets the usage chunk
    ):
        for chunk in raw.chat.completions.create(model="tiny", messages=messages, stream=True):
            assert chunk.choices[0].index == 0
    spec = FrontSetup(loopback_policy(), "tiny", 2048)
    with (
        running_front(spec, fake_engine, Shapes("lucebox", "tiny", 2048, False)) as front,
        openai.OpenAI(base_url=f"{front.url}/v1", api_key="none", max_retries=0) as oai,
    ):
        chunks = list(oai.chat.completions.create(model="tiny", messages=messages, stream=True))
        deltas = [c.choices[0].delta for c in chunks]
        assert deltas[0].content == "" and "".join(d.content or "" for d in deltas).strip()
        asked = list(
            oai.chat.completions.create(
                model="tiny",
                messages=messages,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    assert [c.usage is not None for c in asked].count(True) == 1 and asked[-1].usage
    with (
        running_front(spec, fake_engine, Shapes("lucebox", "tiny", 2048, False)) as front,
        openai.OpenAI(base_url=f"{front.url}/v1", api_key="none", max_retries=0) as oai,
    ):
        capped = list(
            oai.chat.completions.create(model="tiny", messages=messages, stream=True, max_tokens=3)
        )
        assert [c.choices[0].finish_reason for c in capped if c.choices][-1] == "length"
        with pytest.raises(openai.BadRequestError, match="cannot constrain a reply to json_object"):
            oai.chat.completions.create(
                model="tiny", messages=messages, response_format={"type": "json_object"}
            )
