"""`lucebox serve` end to end: the real CPU engine serving the real Gemma 3 270M."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

import httpx
import pytest

from support.ports import free_port
from support.realmodels import smoke_serve_argv
from support.smolserver import private_engine_home
from tests.conftest import alive, run_lucebox

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def home(built_engine_home, tmp_path_factory) -> dict[str, str]:
    """A home of its own, pulled once for the module: the tests assert the plan's own choice,
    which a verdict stored in a shared home by another run would change."""
    return {"LUCEBOX_HOME": str(private_engine_home(tmp_path_factory.mktemp("smoke-home")))}


@pytest.fixture
def served(home):
    port = free_port()
    env = {**os.environ, **home}
    proc = subprocess.Popen(
        smoke_serve_argv(port),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    mine = f"http://127.0.0.1:{port}"
    status = wait_for(
        home, lambda s: s["state"] == "ready" and s["url"] == mine, timeout_s=300, proc=proc
    )
    yield proc, port, status, home
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.stdout is not None
    proc.stdout.close()


def status(home: dict[str, str]) -> dict:
    result = run_lucebox("status", "--json", env=home)
    return json.loads(result.stdout)


def wait_for(home: dict[str, str], predicate, timeout_s: float, proc=None) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        current = status(home)
        if predicate(current):
            return current
        if proc is not None and proc.poll() is not None:
            raise AssertionError(proc.stdout.read() if proc.stdout else "serve exited")
        time.sleep(0.5)
    raise AssertionError(f"timed out; last status {current}")


def test_chat_stream_status_restart_and_clean_stop(served):
    proc, port, ready, home = served
    url = f"http://127.0.0.1:{port}"
    messages = [{"role": "user", "content": "Say hello."}]
    reply = httpx.post(
        f"{url}/v1/chat/completions", timeout=120, json={"messages": messages, "max_tokens": 16}
    ).json()
    assert reply["model"] == "smoke" and reply["usage"]["completion_tokens"] > 0
    chunks = []
    with httpx.stream(
        "POST",
        f"{url}/v1/chat/completions",
        timeout=120,
        json={"messages": messages, "max_tokens": 16, "stream": True},
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    assert any(c["choices"] and c["choices"][0]["delta"].get("content") for c in chunks)
    sampled = wait_for(
        home, lambda s: (s["sample"] or {}).get("requests_finished_total", 0) >= 2, timeout_s=10
    )
    assert sampled["sample"]["decode_tokens_per_s"] > 0
    # Both replies counted once, from the engine's own timing lines; on a CPU the planner
    # speculates with n-grams only (too few drafts yet for the guard to judge them).
    assert sampled["sample"]["requests_finished_total"] == 2
    assert sampled["spec"]["type"] == "ngram-mod" and sampled["spec"]["active"] is not False
    assert sampled["cache"]["full_reprocess_events"] == 0
    assert sampled["cache"]["cached_prompt_share"] > 0  # the second prompt repeats the first

    first_engine = ready["engine_pid"]
    os.kill(first_engine, signal.SIGKILL)
    back = wait_for(
        home, lambda s: s["state"] == "ready" and s["engine_pid"] != first_engine, timeout_s=120
    )
    assert back["restarts"] >= 1
    again = httpx.post(
        f"{url}/v1/chat/completions", timeout=120, json={"messages": messages, "max_tokens": 4}
    )
    assert again.status_code == 200

    second = run_lucebox(
        "serve",
        "--preset",
        "smoke",
        "--port",
        str(free_port()),
        env=home,
    )
    assert second.returncode == 1 and "already serves" in second.stderr

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert not alive(back["engine_pid"])
    assert status(home)["state"] == "stopped"


def test_port_in_use_is_named(home):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run_lucebox(
            "serve",
            "--preset",
            "smoke",
            "--port",
            str(port),
            env=home,
            timeout_s=300,
        )
    assert result.returncode == 1
    assert f"port {port} is held by" in result.stdout
    assert status(home)["state"] == "stopped"
