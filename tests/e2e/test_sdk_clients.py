"""The official `openai` and `anthropic` SDKs against the real server (SmolLM2 on the CPU).

What coding agents send: Chat Completions (OpenCode, aider), Responses (Codex), Anthropic
Messages (Claude Code), each plain and streamed, and each with a tool call and its result in
the history. SmolLM2's template renders no tool schemas, so its replies are text: these tests
prove the requests agents make are accepted and the replies parse in the SDKs agents use.
Replies are a few tokens: the shared 2-core CI machine decodes slowly.
"""

from __future__ import annotations

import anthropic
import openai
import pytest

pytestmark = pytest.mark.slow

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
WEATHER_FUNCTION = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": WEATHER_PARAMETERS,
}
WEATHER_TOOL = {"type": "function", "function": WEATHER_FUNCTION}


@pytest.fixture(scope="module")
def oai(smol_server):
    # The SDK's retries would hide a dropped connection; the tests must see it.
    with openai.OpenAI(
        base_url=f"{smol_server.url}/v1", api_key=smol_server.api_key or "none", max_retries=0
    ) as client:
        yield client


@pytest.fixture(scope="module")
def claude(smol_server):
    with anthropic.Anthropic(
        base_url=smol_server.url, api_key=smol_server.api_key or "none", max_retries=0
    ) as client:
        yield client


def test_chat_completion_and_usage(oai, smol_server):
    reply = oai.chat.completions.create(
        model=smol_server.model or "any",
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=6,
        temperature=0,
    )
    assert reply.choices[0].message.content
    assert reply.model == smol_server.model
    assert reply.usage.prompt_tokens > 0 and 0 < reply.usage.completion_tokens <= 6


def test_chat_stream_with_tool_history(oai):
    messages = [
        {"role": "user", "content": "What is the weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C."},
    ]
    stream = oai.chat.completions.create(
        model="any",
        messages=messages,
        tools=[WEATHER_TOOL],
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    usage = [c.usage for c in chunks if c.usage is not None]
    assert usage and usage[-1].prompt_tokens > 20


def test_responses_plain_and_streamed_with_a_function_call(oai):
    reply = oai.responses.create(model="any", input="Say hello.", max_output_tokens=6)
    assert reply.status == "completed" and reply.output_text
    history = [
        {"role": "user", "content": "What is the weather in Oslo?"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Oslo"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C."},
    ]
    tools = [{"type": "function", **WEATHER_FUNCTION}]
    # Raw events: the SDK's `responses.stream()` helper needs `output_index`/`content_index`
    # on each delta, which llama-server b11434 does not send (server-task.cpp, output_text.delta).
    events = list(
        oai.responses.create(
            model="any", input=history, tools=tools, max_output_tokens=6, stream=True
        )
    )
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text.strip()
    completed = events[-1].response
    usage = completed.usage
    assert completed.status == "completed"
    assert usage.input_tokens + usage.input_tokens_details.cached_tokens > 20


def test_anthropic_messages_plain_and_streamed_with_tool_use(claude, smol_server):
    message = claude.messages.create(
        model="any", max_tokens=6, messages=[{"role": "user", "content": "Say hello."}]
    )
    assert message.content[0].type == "text" and message.content[0].text
    assert message.usage.output_tokens > 0
    history = [
        {"role": "user", "content": "What is the weather in Oslo?"},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Oslo"},
                }
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny."}],
        },
    ]
    tools = [
        {
            "name": "get_weather",
            "description": "Current weather of a city",
            "input_schema": WEATHER_PARAMETERS,
        }
    ]
    with claude.messages.stream(
        model="any", max_tokens=6, messages=history, tools=tools, system="Be brief."
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text.strip() and final.stop_reason in ("end_turn", "max_tokens")
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) > 20
