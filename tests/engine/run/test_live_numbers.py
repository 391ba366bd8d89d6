"""The live numbers of the Lucebox engine against its own per-reply timings: decode as its
decode line timed it, time to first token as the client waited it (PFlash's scoring and
KVFlash's paging included), and a sample taken as soon as a reply finishes."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncGenerator
from pathlib import Path

import httpx
import pytest

from lucebox.engine.run.kinds.enginelog import EngineLog
from lucebox.engine.run.kinds.luceboxrun import (
    LuceboxLog,
    LuceboxSampler,
    parse_decode,
    parse_reply,
)
from tests.engine.enginelog import engine_lines

FIXTURES = Path(__file__).parents[1] / "fixtures" / "lucebox"
RECORDED = ("plain.log", "kvflash.log", "kvflash-auto.log", "ddtree-spec.log", "chain.log")
"""Logs recorded from the engine on the H100: plain, KVFlash, DDTree and chain replies."""
PFLASH_128K = [
    "[server] chat START chatcmpl_0000000000000007 format=chat stream=true prompt_tokens=131072 "
    "max_tokens=128 tools=0",
    "[ar-decode] tokens=128 time=0.500 s speed=256.00 tok/s",
    "[server] chat DONE chatcmpl_0000000000000007 ok=true in=131072 effective_in=6554 out=128 "
    "23.2s 5.5 tok/s finish=length restore=false slot=-1 prefix_len=0 prefill=1.3s "
    "decode=0.5s(256.0tok/s) error=- detail=-",
]
"""A 128K PFlash reply in the engine's line formats, with the figures measured on the H200
(FACTS.md): the target's prefill 1.3 s, the client's wait for the first token 22.7 s (the
drafter's scoring is the rest), 128 tokens at 256 tok/s."""


def replies(lines: list[str]) -> list[tuple[float, float, float, int]]:
    """Each successful reply's (engine decode tok/s, decode s, client wait s, tokens) from
    its decode line and DONE line: what the engine itself says of it."""
    found, decode = [], None
    for line in lines:
        decode = parse_decode(line) or decode
        reply = parse_reply(line)
        if reply is None:
            continue
        if reply.ok and decode is not None:
            wait_s = reply.total_s - decode.time_s
            found.append((decode.tokens_per_s, decode.time_s, wait_s, decode.tokens))
        decode = None
    return found


def fed(lines: list[str]) -> LuceboxLog:
    log = LuceboxLog()
    for line in lines:
        log.feed(line)
    return log


@pytest.mark.parametrize("name", RECORDED)
def test_each_recorded_reply_reads_as_the_engine_timed_it(name):
    lines = (FIXTURES / name).read_text().splitlines()
    finished = fed(lines).take_finished()
    expected = replies(lines)
    assert len(finished) == len(expected) > 0
    for request, (rate, decode_s, wait_s, tokens) in zip(finished, expected, strict=True):
        assert request.decode_steps == tokens
        # The same rate, to the millisecond the line prints its time in.
        assert abs(request.decode_s - tokens / rate) <= 0.0005
        assert request.decode_steps / request.decode_s == pytest.approx(rate, rel=0.03)
        assert request.decode_s == decode_s
        assert request.first_token_s == pytest.approx(max(0.0, wait_s))


def test_a_kvflash_reply_waits_longer_than_its_prefill():
    """The 2,842-token KVFlash reply: DONE says 128 tokens at 358.1 tok/s in all (0.357 s; its
    0.4 s is rounded), 0.2 s prefill, and its decode line 0.181 s: the client waited 0.176 s
    for the first token."""
    (_, long_reply, *_) = fed((FIXTURES / "kvflash.log").read_text().splitlines()).take_finished()
    assert long_reply.prompt_tokens == 2842
    assert long_reply.prompt_s == 0.2
    assert long_reply.first_token_s == pytest.approx(128 / 358.1 - 0.181)


class Status:
    """The engine's /status/json, idle or busy as the test sets it."""

    def __init__(self) -> None:
        self.phase = "idle"

    def handler(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/status/json"
        return httpx.Response(200, json={"phase": self.phase, "perf_history": []})


async def test_pflash_time_to_first_token_is_the_clients_wait_not_the_targets_prefill():
    status, log = Status(), LuceboxLog()
    sampler = LuceboxSampler("http://engine", os.getpid(), log)
    async with httpx.AsyncClient(transport=httpx.MockTransport(status.handler)) as client:
        status.phase = "prefill"
        running = await sampler.sample_once(client)
        for line in PFLASH_128K:
            log.feed(line)
        status.phase = "idle"
        done = await sampler.sample_once(client)
    assert running is not None and running.slots_busy == 1
    assert done is not None and done.requests_finished == 1 and done.slots_busy == 0
    assert done.ttft_s == pytest.approx(22.7) and done.last_ttft_s == pytest.approx(22.7)
    assert done.last_decode_tokens_per_s == pytest.approx(256.0)
    assert done.last_prefill_tokens_per_s == pytest.approx(6554 / 1.3)


async def test_a_finished_reply_is_sampled_at_once():
    """The sampler waits its interval between samples, but a reply that finishes wakes it:
    a status read right after a reply never shows it running."""
    status, log = Status(), LuceboxLog()
    sampler = LuceboxSampler("http://engine", os.getpid(), log, interval_s=60.0)
    sampler.client = httpx.AsyncClient(transport=httpx.MockTransport(status.handler))
    samples = sampler.samples()
    assert isinstance(samples, AsyncGenerator)
    status.phase = "decode"
    first = await anext(samples)
    assert first.slots_busy == 1
    status.phase = "idle"
    started_s = time.monotonic()
    for line in PFLASH_128K:
        log.feed(line)
    async with asyncio.timeout(5):
        after = await anext(samples)
    assert time.monotonic() - started_s < 1.0
    assert after.requests_finished == 1 and after.slots_busy == 0
    await samples.aclose()
    await sampler.client.aclose()


def test_llama_servers_finished_request_wakes_the_sampler_too():
    """llama-server's request ends at its `stop processing` line: only then is it finished."""
    log = EngineLog()
    lines = engine_lines("two_slots")
    last_stop = max(i for i, line in enumerate(lines) if "stop processing" in line)
    for line in lines[:last_stop]:
        log.feed(line)
    log.take_finished()
    log.finished_one.clear()
    log.feed(lines[last_stop])
    assert log.finished_one.is_set() and len(log.take_finished()) == 1
