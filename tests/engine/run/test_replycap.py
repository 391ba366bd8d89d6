"""A reply limit beyond the plan is clamped, never refused: agents ask for 32K-64K tokens of
reply; the front cuts the limit to the plan's budget, and to the room a long prompt leaves
where the Lucebox engine refuses the two together (the recorded-contract stand-in admits as
the engine does: support/luceboxfake.py)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import httpx
import pytest

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.run.front.replycap import clamped, within_room
from lucebox.engine.run.runsetup import RunFacts
from lucebox.engine.run.serverrun.serverrun import ServerRun
from lucebox.engine.run.supervision.serverevent import ServerEvent
from lucebox.engine.run.supervisor import Supervisor
from support.ports import free_port
from tests.engine.run.test_luceboxserve import FLAGS, lucebox_spec

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
LONG_PROMPT_CHARS = 4 * 3800
"""A prompt of 3,800 tokens as the stand-in counts them: 296 left of the 4,096 context, under
the plan's 512-token budget."""


@pytest.mark.parametrize(
    ("endpoint", "asked", "sent"),
    [
        (CHAT, {"max_tokens": 65536}, {"max_tokens": 512}),
        (CHAT, {"max_completion_tokens": 32000}, {"max_completion_tokens": 512}),
        (CHAT, {"max_tokens": -1}, {"max_tokens": 512}),
        (CHAT, {"max_tokens": 100}, {"max_tokens": 100}),
        (MESSAGES, {"max_tokens": 64000}, {"max_tokens": 512}),
        ("/v1/responses", {"max_output_tokens": 64000}, {"max_output_tokens": 512}),
        ("/v1/embeddings", {"max_tokens": 64000}, {"max_tokens": 64000}),
    ],
)
def test_a_limit_beyond_the_budget_is_the_budget(endpoint, asked, sent):
    assert clamped(asked, endpoint, 512) == sent
    assert clamped(asked, endpoint, None) == asked


def test_only_a_refusal_for_the_limit_is_sent_again():
    refusal = (
        b'{"error":{"message":"This model\'s maximum context length is 4096 tokens. However, you '
        b'requested 4312 tokens (3800 in the messages, 512 in the completion). Please reduce"}}'
    )
    again = within_room(b'{"max_tokens":512}', CHAT, refusal)
    assert again is not None and json.loads(again) == {"max_tokens": 296}
    # No limit asked: the engine's default was refused; the room is asked for instead.
    assert json.loads(within_room(b"{}", MESSAGES, refusal) or b"") == {"max_tokens": 296}
    prompt_too_long = refusal.replace(b"3800 in", b"4096 in")
    assert within_room(b'{"max_tokens":512}', CHAT, prompt_too_long) is None
    assert within_room(b'{"max_tokens":512}', CHAT, b'{"error":"bad json"}') is None


async def _ask(url: str) -> dict[str, httpx.Response]:
    long_text = "word " * (LONG_PROMPT_CHARS // 5)
    asks = {
        "chat": (CHAT, "hi", 65536),
        "long chat": (CHAT, long_text, 65536),
        "long messages": (MESSAGES, long_text, 64000),
    }
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        return {
            name: await client.post(
                path, json={"messages": [{"role": "user", "content": text}], "max_tokens": limit}
            )
            for name, (path, text, limit) in asks.items()
        }


async def test_agents_limits_are_answered_on_the_lucebox_engine(tmp_path, monkeypatch):
    bodies = tmp_path / "bodies.jsonl"
    rates = tmp_path / "rates.json"
    rates.write_text(json.dumps({"decode_tok_s": 100.0, "prefill_tok_s": 1000.0}))
    monkeypatch.setenv("FAKE_REQUESTS", str(tmp_path / "requests.txt"))
    monkeypatch.setenv("FAKE_BODIES", str(bodies))
    monkeypatch.setenv("FAKE_RATES", str(rates))
    spec = replace(lucebox_spec(tmp_path), engine_port=free_port())
    supervisor = Supervisor(spec, tmp_path / "engine.log", ready_timeout_s=20)
    run = ServerRun(resolve_paths(), supervisor, RunFacts(model="tiny", gpu_index=0))
    answers: dict[str, httpx.Response] = {}
    async with asyncio.timeout(90):
        async for item in run.events():
            if isinstance(item, ServerEvent) and item.kind == "ready":
                answers = await _ask(run.public_url)
                run.stop()
    assert {name: a.status_code for name, a in answers.items()} == dict.fromkeys(answers, 200)
    usage = {name: a.json()["usage"]["completion_tokens"] for name, a in answers.items()}
    # The plan's budget, then the room each long prompt leaves: the reply fits the context.
    assert usage == {"chat": FLAGS.max_tokens, "long chat": 296, "long messages": 296}
    limits = [json.loads(line)["max_tokens"] for line in bodies.read_text().splitlines()]
    # The warm-up's, then: one within budget, two refused for the limit and sent again.
    assert limits[1:] == [512, 512, 296, 512, 296]
    assert "clamped to default_max_tokens" not in (tmp_path / "engine.log").read_text()
