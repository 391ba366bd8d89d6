"""The served mix records sampling: `lucebox serve` of the real SmolLM2 on the CPU engine,
clients' sampled and greedy requests, and `status --json` showing what they got."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from support.ports import free_port
from support.realmodels import smol_model
from support.smolserver import private_engine_home
from tests.conftest import run_lucebox

pytestmark = pytest.mark.slow


def status(home: dict[str, str]) -> dict:
    return json.loads(run_lucebox("status", "--json", env=home).stdout)


def wait_for(home: dict[str, str], predicate, timeout_s: float, proc) -> dict:
    deadline = time.monotonic() + timeout_s
    current: dict = {}
    while time.monotonic() < deadline:
        current = status(home)
        if predicate(current):
            return current
        assert proc.poll() is None, "serve exited"
        time.sleep(0.5)
    raise AssertionError(f"timed out; last status {current}")


def test_status_shows_the_sampling_clients_sent(built_engine_home, tmp_path):
    home = {"LUCEBOX_HOME": str(private_engine_home(tmp_path / "home"))}
    port = free_port()
    argv = [sys.executable, "-m", "lucebox.app.cli", "serve", "--model", str(smol_model())]
    proc = subprocess.Popen(
        [*argv, "--port", str(port), "--ctx", "2048"],
        env={**os.environ, **home},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        ready = wait_for(home, lambda s: s["state"] == "ready", 300, proc)
        # Before any request the defaults stand in: the GGUF has no general.sampling.* keys,
        # so llama.cpp's own (temperature 0.8) fill unset fields on either engine.
        assert ready["sampling"] == {
            "greedy": 0,
            "sampled": 0,
            "temperature": 0.8,
            "from": "defaults",
            "greedy_acceptance": None,
            "sampled_acceptance": None,
        }
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        messages = [{"role": "user", "content": "Say hello."}]
        with httpx.Client(timeout=120) as client:
            for extra in ({"temperature": 0.7}, {"temperature": 0.7, "top_p": 0.9}, {}):
                body = {"messages": messages, "max_tokens": 4, "seed": 1, **extra}
                assert client.post(url, json=body).status_code == 200
            body = {"messages": messages, "max_tokens": 4, "temperature": 0}
            assert client.post(url, json=body).status_code == 200

        def all_counted(s: dict) -> bool:
            mix = s["sampling"] or {}
            return mix.get("greedy", 0) + mix.get("sampled", 0) == 4

        mixed = wait_for(home, all_counted, 10, proc)
        assert mixed["sampling"] == {
            "greedy": 1,
            "sampled": 3,
            "temperature": 0.7,
            "from": "clients",
            # No draft serves here: the replies' timings carry no draft tokens to count.
            "greedy_acceptance": None,
            "sampled_acceptance": None,
        }
        text = run_lucebox("status", env=home).stdout
        assert "\n  sampling: 3 sampled (mostly at temperature 0.7), 1 greedy" in text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
