"""Speculation through `lucebox serve` on the real CPU engine: the MTP head of a generated model
runs when asked for and its counters reach `status --json`; speculation that does not pay on
this CPU is switched off by the guard (a restart through the one stop path), and the status
keeps saying what was planned and why it stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import httpx
import pytest

from lucebox.engine.paths import resolve_paths
from lucebox.engine.runstate import engine_log
from tests.conftest import run_lucebox
from tests.ggufgen import cached_gguf, qwen35_target
from tests.ports import free_port
from tests.realmodels import engine_home

pytestmark = pytest.mark.slow


def status() -> dict:
    done = run_lucebox("status", "--json", env={"LUCEBOX_HOME": str(engine_home())})
    return json.loads(done.stdout)


def serve_until(extra: list[str], done: Callable[[dict], bool], timeout_s: float = 600) -> list:
    """Serve the generated hybrid model, send requests until ``done(status)``; the statuses."""
    target = cached_gguf(qwen35_target())
    port = free_port()
    env = {**os.environ, "LUCEBOX_HOME": str(engine_home())}
    argv = [sys.executable, "-m", "lucebox.app.cli", "serve", "--model", str(target)]
    serve = subprocess.Popen(
        [*argv, *extra, "--port", str(port), "--ctx", "2048"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    seen: list[dict] = []
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            now = status()
            if now["state"] == "ready" and now["url"] == url:
                seen.append(now)
                if done(now):
                    return seen
                body = {"prompt": "hello world the model", "n_predict": 64, "ignore_eos": True}
                with httpx.Client(timeout=120) as client:
                    client.post(f"{url}/completion", json={**body, "temperature": 0})
            assert serve.poll() is None, serve.stdout.read() if serve.stdout else ""
            time.sleep(0.3)
        raise AssertionError(f"not reached; last status {seen[-1] if seen else None}")
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=60)
        assert serve.stdout is not None
        serve.stdout.close()


def test_the_mtp_head_runs_when_asked_and_its_counters_reach_status(built_engine_home):
    def warned(now: dict) -> bool:
        return "kept, as --spec asked" in (now["spec"] or {}).get("reason", "")

    seen = serve_until(["--spec", "mtp"], warned)
    spec = seen[-1]["spec"]
    assert spec["type"] == "draft-mtp" and spec["active"] is True
    assert spec["acceptance"] is not None and spec["acceptance"] < 0.5  # random weights
    assert seen[-1]["restarts"] == 0  # the user's choice is kept, with the warning


def test_speculation_that_does_not_pay_on_this_cpu_is_switched_off(built_engine_home):
    def switched_off(now: dict) -> bool:
        return (now["spec"] or {}).get("active") is False

    seen = serve_until([], switched_off)
    first, last = seen[0]["spec"], seen[-1]["spec"]
    assert first["type"] == "ngram-mod"  # auto on a CPU: no model drafts
    assert last["type"] == "ngram-mod" and "switched off" in last["reason"]
    assert last["acceptance"] is not None
    assert seen[-1]["restarts"] >= 1
    log = engine_log(resolve_paths({"LUCEBOX_HOME": str(engine_home())})).read_text()
    starts = [line for line in log.splitlines() if line.startswith("# lucebox: starting")]
    assert "--spec-type" in starts[0] and "--spec-type" not in starts[-1]
