"""The front's rules (pure): who may call, from which page, and the queue's order and bound."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from lucebox.engine.run.front.frontguard import FrontPolicy, refusal
from lucebox.engine.run.front.frontqueue import FrontQueue, QueueFullError
from lucebox.engine.run.hang import DECODE_SILENCE_S, HangBounds, Watch, hung, observe
from lucebox.engine.run.runstate import Status
from lucebox.engine.run.sample import QueueStatus

LAN = FrontPolicy("0.0.0.0", 8080, "k3y", ("lucebox-pc", "lucebox-pc.local"))


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"host": "127.0.0.1:8080", "authorization": "Bearer k3y"}, None),
        ({"host": "192.168.1.20:8080", "x-api-key": "k3y"}, None),
        ({"host": "lucebox-pc.local:8080", "authorization": "Bearer k3y"}, None),
        ({"host": "[::1]:8080", "authorization": "Bearer k3y"}, None),
        ({"host": "127.0.0.1:8080"}, 401),
        ({"host": "127.0.0.1:8080", "authorization": "Bearer k3"}, 401),
        ({"host": "rebind.attacker.example:8080", "authorization": "Bearer k3y"}, 421),
        ({"authorization": "Bearer k3y"}, 421),
        ({"host": "127.0.0.1:8080", "authorization": "Bearer k3y",
          "origin": "http://attacker.example"}, 403),
        ({"host": "127.0.0.1:8080", "authorization": "Bearer k3y",
          "origin": "http://localhost:8080"}, None),
        ({"host": "127.0.0.1:8080", "authorization": "Bearer k3y",
          "origin": "http://localhost:9999"}, 403),
        ({"host": "127.0.0.1:8080", "authorization": "Bearer k3y", "origin": "null"}, 403),
    ],
)  # fmt: skip
def test_who_may_call(headers, status):
    refused = refusal(LAN, "POST", "/v1/chat/completions", headers)
    assert (refused.status if refused else None) == status


def test_origins_the_user_allowed_and_no_others():
    from lucebox.engine.machine.config import parse_value
    from lucebox.engine.run.front.frontguard import cors_headers

    allowed = parse_value(
        "server.allowed_origins", "HTTP://192.168.1.20:3000/, https://chat.lan:443"
    )
    assert allowed == ("http://192.168.1.20:3000", "https://chat.lan")
    policy = dataclasses.replace(LAN, allowed_origins=allowed)
    call = {"host": "192.168.1.5:8080", "authorization": "Bearer k3y"}
    for origin in ("http://192.168.1.20:3000", "https://chat.lan"):
        assert (
            refusal(policy, "OPTIONS", "/v1/chat/completions", {**call, "origin": origin}) is None
        )
        assert ("access-control-allow-origin", origin) in cors_headers(origin)
    for origin in ("http://192.168.1.20:3001", "http://attacker.example", "https://chat.lan:8443"):
        refused = refusal(policy, "OPTIONS", "/v1/chat/completions", {**call, "origin": origin})
        assert refused is not None and refused.status == 403
    unset = refusal(LAN, "OPTIONS", "/v1/models", {**call, "origin": "http://192.168.1.20:3000"})
    assert unset is not None and unset.status == 403
    anyone = dataclasses.replace(LAN, allowed_origins=parse_value("server.allowed_origins", "*"))
    assert refusal(anyone, "POST", "/v1/models", {**call, "origin": "http://any.example"}) is None
    keyless = refusal(
        anyone, "POST", "/v1/models", {"host": "10.0.0.2:8080", "origin": "http://a.example"}
    )
    assert keyless is not None and keyless.status == 401  # an allowed origin still needs the key


def test_origins_are_written_as_origins():
    from lucebox.engine.core.errors import ConfigError
    from lucebox.engine.machine.config import parse_value, settings_from_toml

    for bad in ("192.168.1.20:3000", "ftp://x", "http://x/chat", "http://"):
        with pytest.raises(ConfigError, match="takes web origins"):
            parse_value("server.allowed_origins", bad)
    settings = settings_from_toml(Path("c.toml"), '[server]\nallowed_origins = ["http://a.lan:80"]')
    assert settings.allowed_origins == ("http://a.lan",)
    with pytest.raises(ConfigError, match=r"c\.toml: key 'server\.allowed_origins' takes web"):
        settings_from_toml(Path("c.toml"), '[server]\nallowed_origins = ["a.lan"]')


def test_health_and_the_page_need_no_key_but_the_api_does():
    plain = {"host": "localhost:8080"}
    assert refusal(LAN, "GET", "/health", plain) is None
    assert refusal(LAN, "GET", "/", plain) is None
    # llama-server's page loads its bundle without the key (recorded from its web UI).
    for asset in ("/_app/immutable/bundle.CC3ZW0AM.js", "/_app/version.json", "/favicon.svg"):
        assert refusal(LAN, "GET", asset, plain) is None
    assert refusal(LAN, "POST", "/_app/immutable/bundle.CC3ZW0AM.js", plain) is not None
    for api in ("/v1/models", "/props", "/slots", "/metrics", "/v1/models.json"):
        assert refusal(LAN, "GET", api, plain) is not None
    assert refusal(FrontPolicy("127.0.0.1", 8080), "GET", "/v1/models", plain) is None


async def test_the_queue_is_first_come_first_served_and_bounded():
    queue = FrontQueue(capacity=1, max_waiting=2)
    first, second, third = queue.enter(), queue.enter(), queue.enter()
    assert first.admitted.is_set() and not second.admitted.is_set()
    queue.serving(first)
    assert (queue.position(second), queue.position(third)) == (1, 2)
    with pytest.raises(QueueFullError) as full:
        queue.enter()
    assert full.value.retry_after_s >= 1
    queue.leave(second)  # a client that left while waiting
    assert queue.position(third) == 1
    await asyncio.sleep(0.05)
    queue.leave(first)
    assert third.admitted.is_set()
    queue.serving(third)
    status = queue.status()
    assert (status.depth, status.running, status.served, status.rejected) == (0, 1, 1, 1)
    assert status.mean_service_s is not None and status.mean_service_s >= 0.05


async def test_a_hold_for_the_engine_counts_as_waiting_not_as_service():
    """An admitted request held while the engine restarts waits, in the status and in the
    measured service time; the engine's time starts when the front relays it."""
    queue = FrontQueue(capacity=1)
    held = queue.enter()
    await asyncio.sleep(0.2)  # the engine is not ready
    status = queue.status()
    assert (status.depth, status.running) == (1, 0)
    assert status.oldest_wait_s is not None and status.oldest_wait_s >= 0.2
    queue.serving(held)
    assert (queue.status().depth, queue.status().running) == (0, 1)
    queue.leave(held)
    status = queue.status()
    assert status.served == 1
    assert status.mean_service_s is not None and status.mean_service_s < 0.1
    timed_out = queue.enter()
    queue.leave(timed_out)  # answered 503 by the front, never served
    assert queue.status().served == 1


def test_the_queue_is_kept_in_the_state_file():
    queue = QueueStatus(2, 1, 3.5, 32, 1, 10, 0, 4.2)
    status = Status("ready", queue=queue)
    assert status.to_json()["queue"]["depth"] == 2
    assert Status.from_file_json(status.to_file_json()) == status


def test_the_front_sees_a_stream_stall_where_the_engine_answers_no_look():
    """A stopped engine answers no look; the front still sees its requests: one sent and
    silent, then tokens flowing (decoding, the chunks its progress), then stalled, which the
    hang rule judges by the decode bound."""
    queue = FrontQueue(capacity=1)
    assert queue.engine_look(0.0) is None  # nothing in the engine
    ticket = queue.enter()
    assert queue.engine_look(0.0) is None  # admitted, not sent yet
    queue.serving(ticket)
    sent = queue.engine_look(0.0)
    assert sent is not None and sent.busy and sent.phase == "silent"
    ticket.engine_chunks = 20
    watch = observe(Watch(), queue.engine_look(1.0), 1.0)
    assert watch.phase == "decode" and watch.since_s == 1.0
    watch = observe(watch, queue.engine_look(30.0), 30.0)  # no chunk since: the same count
    assert watch.since_s == 1.0
    assert "no token for" in (hung(watch, 1.0 + DECODE_SILENCE_S, None, HangBounds()) or "")
    ticket.engine_chunks += 1
    assert observe(watch, queue.engine_look(40.0), 40.0).since_s == 40.0
    queue.leave(ticket)
    assert queue.engine_look(41.0) is None
