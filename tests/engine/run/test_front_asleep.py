"""The front while the engine sleeps (no engine process behind it): polls are answered from
the run without waking it, and every admitted request is told to the sleep watch."""

from __future__ import annotations

import time

import httpx

from lucebox.engine.run.front.frontsetup import FrontSetup
from lucebox.engine.run.runstate import Status
from support.frontserver import loopback_policy, running_front
from support.ports import free_port


def test_polls_are_answered_while_asleep_and_every_request_is_told():
    nobody = f"http://127.0.0.1:{free_port()}"  # no engine listens: it sleeps
    seen: list[tuple[str, str]] = []
    spec = FrontSetup(loopback_policy(), "qwen", 8192, engine_wait_s=1.0)
    with running_front(spec, nobody) as running:
        running.front.status = lambda: Status("sleeping")
        running.front.on_request = lambda method, path: seen.append((method, path))
        running.loop.call_soon_threadsafe(running.front.engine_ready, False)
        time.sleep(0.2)
        models = httpx.get(f"{running.url}/v1/models", timeout=10)
        health = httpx.get(f"{running.url}/health", timeout=10)
        asked_s = time.monotonic()
        props = httpx.get(f"{running.url}/props", timeout=10)
        waited_s = time.monotonic() - asked_s
    assert models.status_code == 200, models.text
    assert [(m["id"], m["context_length"]) for m in models.json()["data"]] == [("qwen", 8192)]
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    # It woke the engine (the watch's part) and waited for it, here past its bound.
    assert props.status_code == 503 and waited_s >= 1.0
    assert "not serving (sleeping)" in props.json()["error"]["message"]
    assert seen == [("GET", "/v1/models"), ("GET", "/health"), ("GET", "/props")]
