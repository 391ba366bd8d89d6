"""Sleep without forgetting, end to end: `lucebox serve` of SmolLM2 on the real CPU llama-server
with a short ``server.sleep_idle_s``. Once idle the engine process is gone and status says
sleeping while the front keeps its port; ``/v1/models`` answers without waking it; the next turn
of the conversation wakes it and is read from the restored slot, not again in full."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.machine import config
from support.ports import free_port
from support.realmodels import smol_model
from support.smolserver import private_engine_home
from tests.conftest import alive, run_lucebox

pytestmark = pytest.mark.slow

SLEEP_IDLE_S = 4
NOTE = "Here is a long project note to keep in mind. "
WARM_TOKENS = 300
"""A warm turn reads its new user message and the reply sent back; a cold one all ~3,000."""


def status(home: dict[str, str]) -> dict:
    return json.loads(run_lucebox("status", "--json", env=home).stdout)


def wait_for(home: dict[str, str], predicate, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        current = status(home)
        if predicate(current):
            return current
        time.sleep(0.5)
    raise AssertionError(f"timed out; last status {current}")


def turn(url: str, messages: list[dict[str, str]], question: str) -> dict[str, float]:
    """One streamed chat turn as a client sends it, the reply appended; the engine's timings
    and ``ttft_s``, the client's wait from sending to the first token."""
    messages.append({"role": "user", "content": question})
    body = {"messages": messages, "max_tokens": 12, "temperature": 0, "stream": True}
    text, ttft_s = "", None
    timings: dict[str, float] = {}
    sent_s = time.monotonic()
    with (
        httpx.Client(timeout=600) as client,
        client.stream("POST", f"{url}/v1/chat/completions", json=body) as reply,
    ):
        assert reply.status_code == 200, reply.read()
        for line in reply.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[len("data: ") :])
            delta = chunk["choices"][0]["delta"].get("content") if chunk["choices"] else None
            if delta and ttft_s is None:
                ttft_s = time.monotonic() - sent_s
            text += delta or ""
            timings = chunk.get("timings", timings)
    messages.append({"role": "assistant", "content": text})
    assert ttft_s is not None
    return {**timings, "ttft_s": ttft_s}


def test_an_idle_engine_sleeps_and_the_next_turn_wakes_it_warm(built_engine_home, tmp_path):
    folder = private_engine_home(tmp_path / "home")
    config.set_setting(resolve_paths({"LUCEBOX_HOME": str(folder)}), "server.sleep_idle_s", "4")
    home = {"LUCEBOX_HOME": str(folder)}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "lucebox.app.cli", "serve", "--model", str(smol_model())]
    proc = subprocess.Popen(
        [*argv, "--port", str(port), "--ctx", "8192"],
        env={**os.environ, **home},
        stdout=subprocess.DEVNULL,
    )
    threading.Thread(target=proc.wait, daemon=True).start()  # reaped as init would
    try:
        awake = wait_for(home, lambda s: s["state"] == "ready" and s["url"] == url, 300)
        assert awake["sleep"]["asleep"] is False and awake["sleep"]["idle_s"] == SLEEP_IDLE_S
        messages = [{"role": "system", "content": "You are a coding agent. " + NOTE * 250}]
        cold = turn(url, messages, "What is the note about?")
        assert cold["prompt_n"] > 2000, cold
        warm = turn(url, messages, "tool result: ok")
        engine_pid = status(home)["engine_pid"]

        asleep = wait_for(home, lambda s: s["state"] == "sleeping", 60)
        assert asleep["sleep"]["asleep"] is True and asleep["engine_pid"] is None
        assert not alive(engine_pid)
        with httpx.Client(timeout=30) as client:
            models = client.get(f"{url}/v1/models")
            assert models.status_code == 200, models.text
            assert [m["id"] for m in models.json()["data"]] == [awake["model"]]
            assert client.get(f"{url}/health").status_code == 200
        time.sleep(2)  # the watch looks twice a second: a poll that woke it would show now
        assert status(home)["state"] == "sleeping"

        after_wake = turn(url, messages, "tool result: done")
        woken = status(home)
        assert woken["state"] == "ready" and woken["sleep"]["asleep"] is False
        assert woken["restarts"] == 0 and woken["planned_restarts"] == 0
    finally:
        run_lucebox("down", env=home)
        proc.wait(timeout=60)
    assert warm["prompt_n"] < WARM_TOKENS, warm
    # Read from the restored slot: the new message and the last reply (the slot was seated
    # without it, slots.py says why), not the whole conversation again.
    assert after_wake["prompt_n"] < WARM_TOKENS < after_wake["cache_n"], after_wake
    # The engine's start is in the wait; the conversation read again would double it.
    assert after_wake["ttft_s"] < cold["ttft_s"] / 2, (after_wake, cold)
    said = Path(awake["log"]).read_text(errors="replace")
    assert "# lucebox: sleeping:" in said and "# lucebox: slot restored" in said
