"""A warm prompt survives `lucebox down` and a new `lucebox serve`: the slot is saved on the
stop path and restored on start, so the first call after the restart reports cached tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import httpx
import pytest

from lucebox.engine.core.paths import resolve_paths
from support.ports import free_port
from support.realmodels import engine_home, smol_model
from tests.conftest import run_lucebox

pytestmark = pytest.mark.slow

HISTORY = "You are a careful assistant. " + "Here is a long project note to keep in mind. " * 60


def serve_until_ready(port: int) -> subprocess.Popen[str]:
    env = {**os.environ, "LUCEBOX_HOME": str(engine_home())}
    argv = [sys.executable, "-m", "lucebox.app.cli", "serve", "--model", str(smol_model())]
    proc = subprocess.Popen(
        [*argv, "--port", str(port)], env=env, stdout=subprocess.DEVNULL, text=True
    )
    # Reap it as soon as it exits, as init would: `down` waits until the pid is gone.
    threading.Thread(target=proc.wait, daemon=True).start()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        done = run_lucebox("status", "--json", env={"LUCEBOX_HOME": str(engine_home())})
        status = json.loads(done.stdout)
        if status["state"] == "ready" and status["url"].endswith(f":{port}"):
            return proc
        assert proc.poll() is None, "serve exited"
        time.sleep(0.5)
    raise AssertionError("serve was not ready")


def ask(port: int, question: str) -> dict:
    body = {
        "messages": [
            {"role": "system", "content": HISTORY},
            {"role": "user", "content": question},
        ],
        "max_tokens": 8,
        "temperature": 0,
    }
    with httpx.Client(timeout=300) as client:
        reply = client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
    reply.raise_for_status()
    return reply.json()["timings"]


def test_the_first_call_after_down_and_serve_is_answered_from_the_saved_slot(built_engine_home):
    home = {"LUCEBOX_HOME": str(engine_home())}
    for saved_before in resolve_paths(home).slots_dir.glob("*.slot*"):
        saved_before.unlink()  # an earlier run's slot would make the first call warm too
    port = free_port()
    first = serve_until_ready(port)
    try:
        cold = ask(port, "What is the note about?")
        assert cold["prompt_n"] > 400
    finally:
        down = run_lucebox("down", env=home)
        first.wait(timeout=60)
    assert down.returncode == 0, down.stderr
    saved = list(resolve_paths(home).slots_dir.glob("*.slot"))
    assert saved, "no slot was saved on the stop path"
    second = serve_until_ready(port)
    try:
        warm = ask(port, "Summarise the note in one line.")
    finally:
        run_lucebox("down", env=home)
        second.wait(timeout=60)
    assert warm["cache_n"] > 400, warm
    assert warm["prompt_n"] < cold["prompt_n"] / 4
