"""Speculation through `lucebox serve` on the real CPU engine: the MTP head of a generated model
runs when asked for, and its counters reach `status --json`; a draft that is never accepted is
shortened, then switched off, by the guard."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from support.ggufgen import ModelSpec, cached_gguf, dflash_for, qwen35_target
from support.ports import free_port
from support.smolserver import private_engine_home
from tests.conftest import run_lucebox

pytestmark = pytest.mark.slow


def status(home: Path) -> dict:
    done = run_lucebox("status", "--json", env={"LUCEBOX_HOME": str(home)})
    return json.loads(done.stdout)


def serve_until(
    home: Path,
    extra: list[str],
    done: Callable[[dict], bool],
    *,
    model: ModelSpec,
    timeout_s: float = 180,
) -> list:
    """Serve a generated model from ``home`` (a private one: the guard keeps what it switched
    off in the home's store, which a later run would start from), send requests until
    ``done(status)``; the statuses seen."""
    target = cached_gguf(model)
    port = free_port()
    env = {**os.environ, "LUCEBOX_HOME": str(private_engine_home(home))}
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
            now = status(home)
            if now["state"] == "ready" and now["url"] == url:
                seen.append(now)
                if done(now):
                    return seen
                body = {"prompt": "hello world the model", "n_predict": 64, "ignore_eos": True}
                # The guard restarts the engine between requests: one sent in that moment
                # finds no server, as a client would; the next loop tries again.
                with contextlib.suppress(httpx.TransportError), httpx.Client(timeout=120) as client:
                    client.post(f"{url}/completion", json={**body, "temperature": 0})
            assert serve.poll() is None, serve.stdout.read() if serve.stdout else ""
            time.sleep(0.3)
        raise AssertionError(f"not reached; last status {seen[-1] if seen else None}")
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=60)
        assert serve.stdout is not None
        serve.stdout.close()


def test_the_mtp_head_runs_when_asked_and_its_counters_reach_status(built_engine_home, tmp_path):
    def counted(now: dict) -> bool:
        return ((now["spec"] or {}).get("acceptance") or 0) > 0

    # A head the target agrees with (support/ggufgen.py agree_token): its drafts are accepted.
    model = qwen35_target(agree_token="hello")
    seen = serve_until(tmp_path / "home", ["--spec", "mtp"], counted, model=model)
    spec = seen[-1]["spec"]
    assert spec["type"] == "draft-mtp" and spec["active"] is True
    assert spec["acceptance"] > 0.5 and spec["accepted_per_step"] > 0
    assert seen[-1]["restarts"] == 0


def test_a_draft_that_is_never_accepted_is_shortened_then_switched_off(built_engine_home, tmp_path):
    # Random weights: the target almost never agrees with its DFlash draft.
    target = qwen35_target()
    draft = cached_gguf(dflash_for(target))

    def switched_off(now: dict) -> bool:
        return (now["spec"] or {}).get("active") is False

    seen = serve_until(tmp_path / "home", ["--draft", str(draft)], switched_off, model=target)
    # The first status that knows whether the draft runs (one written before the engine's
    # first sample does not yet).
    first = next(now["spec"] for now in seen if (now["spec"] or {}).get("active") is not None)
    last = seen[-1]["spec"]
    assert first["type"] == "draft-dflash" and first["active"] is True
    assert "the named draft is tried on a CPU" in first["reason"]
    assert last["type"] == "draft-dflash" and last["active"] is False
    assert "speculation switched off" in last["reason"]
    assert "draft-dflash with 7-token drafts was not measured on a CPU" in last["reason"]
    shortened = [(now["spec"] or {}).get("reason", "") for now in seen]
    assert any("drafts shortened to 7 tokens" in reason for reason in shortened)
    assert any("the 65% break-even measured for draft-dflash" in reason for reason in shortened)
    # The guard's own restarts, no crash: once with shorter drafts, once without any.
    assert (seen[-1]["restarts"], seen[-1]["planned_restarts"]) == (0, 2)
