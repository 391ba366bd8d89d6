"""The API normalizations run in lucebox's front on the real path: `lucebox serve`'s pipeline
with the built CPU llama-server behind the front. Each request is sent to the engine's private
port too, where the raw engine shows what it lacks."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from lucebox.engine import pipeline, runstart
from lucebox.engine.core.paths import Paths, resolve_paths
from lucebox.engine.plan.launch import engine_url
from lucebox.engine.plan.options import ServeOptions
from lucebox.engine.run.supervision.serverevent import ServerEvent
from support.ports import free_port
from support.realmodels import smol_model
from support.smolserver import private_engine_home

pytestmark = pytest.mark.slow

TURNS = [
    {"role": "user", "content": "Say hi."},
    {"role": "assistant", "content": "Hi."},
    {"role": "user", "content": "Say bye."},
]
"""A Responses multi-turn input whose items carry no ``type``, as clients send it."""


@pytest.fixture
def home(built_engine_home, tmp_path, monkeypatch) -> Paths:
    folder = private_engine_home(tmp_path / "home")
    monkeypatch.setenv("LUCEBOX_HOME", str(folder))
    return resolve_paths({"LUCEBOX_HOME": str(folder)})


def first_delta(stream: httpx.Response) -> dict:
    for line in stream.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            delta: dict = json.loads(line.removeprefix("data: "))["choices"][0]["delta"]
            return delta
    raise AssertionError("no chunk streamed")


async def test_the_front_shapes_what_llama_server_lacks(home):
    options = ServeOptions(model=str(smol_model()), ctx=2048, port=free_port(), cache="off")
    prepared = pipeline.prepare(home, options, lambda event: None)
    supervisor = runstart.new_supervisor(home, prepared)
    run = runstart.server_run(home, prepared, supervisor)
    front = f"http://127.0.0.1:{prepared.server.port}"
    engine = engine_url(prepared.server)
    seen: dict[str, object] = {}
    async for item in run.events():
        if not isinstance(item, ServerEvent) or item.kind != "ready":
            continue
        # The front runs in this loop: the client asks from a thread.
        seen.update(await asyncio.to_thread(ask_both, front, engine))
        run.stop()
    # Responses: items without "type" are refused by the engine, answered through the front.
    assert seen["responses_engine"] == 400
    assert seen["responses_front"] == 200
    # The first streamed delta: content null from the engine, a string through the front.
    engine_delta, front_delta = seen["delta_engine"], seen["delta_front"]
    assert isinstance(engine_delta, dict) and engine_delta.get("content", "x") is None
    assert isinstance(front_delta, dict) and isinstance(front_delta.get("content", ""), str)
    # A reply cut at max_tokens says so, streamed; a JSON schema is honoured.
    assert seen["finish_front"] == seen["finish_engine"] == "length"
    assert isinstance(json.loads(str(seen["schema_front"]))["n"], int)
    # Anthropic: the engine's id is not a message id; through the front it is.
    assert not str(seen["message_id_engine"]).startswith("msg_")
    assert str(seen["message_id_front"]).startswith("msg_")


SCHEMA_ASKED = {
    "messages": [{"role": "user", "content": "Give a number."}],
    # Greedy, with room: a sampled integer may run past a short cap and cut the JSON.
    "temperature": 0,
    "max_tokens": 64,
    "response_format": {
        "type": "json_schema",
        "json_schema": {
            "name": "number",
            "schema": {
                "type": "object",
                "properties": {"n": {"type": "integer"}},
                "required": ["n"],
                "additionalProperties": False,
            },
        },
    },
}
"""A JSON schema: llama-server constrains its reply to it (the Lucebox engine's is refused)."""


def last_finish(stream: httpx.Response) -> object:
    reasons = [
        json.loads(line.removeprefix("data: "))["choices"][0].get("finish_reason")
        for line in stream.iter_lines()
        if line.startswith("data: {") and '"choices":[{' in line.replace(" ", "")
    ]
    return [r for r in reasons if r][-1]


def ask_both(front: str, engine: str) -> dict[str, object]:
    """The same requests to the front and to the engine behind it."""
    found: dict[str, object] = {}
    with httpx.Client(timeout=120) as client:
        shaped = client.post(f"{front}/v1/chat/completions", json=SCHEMA_ASKED)
        found["schema_front"] = shaped.json()["choices"][0]["message"]["content"]
        for name, base in (("front", front), ("engine", engine)):
            reply = client.post(
                f"{base}/v1/responses", json={"input": TURNS, "max_output_tokens": 8}
            )
            found[f"responses_{name}"] = reply.status_code
            chat = {
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 4,
                "stream": True,
                "temperature": 0,  # the same reply both ways: greedy
            }
            with client.stream("POST", f"{base}/v1/chat/completions", json=chat) as stream:
                found[f"delta_{name}"] = first_delta(stream)
            capped = {**chat, "messages": [{"role": "user", "content": "Count to ten."}]}
            with client.stream("POST", f"{base}/v1/chat/completions", json=capped) as stream:
                found[f"finish_{name}"] = last_finish(stream)
            # A connection of its own: llama-server may close one whose stream was cut.
            message = httpx.post(
                f"{base}/v1/messages",
                json={"model": "x", "max_tokens": 4, "messages": TURNS[:1]},
                timeout=120,
            )
            assert message.status_code == 200, message.text
            found[f"message_id_{name}"] = message.json()["id"]
    return found
