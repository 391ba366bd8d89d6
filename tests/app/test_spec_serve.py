"""Speculation through `lucebox serve` on the real CPU engine: a generated model with an MTP
head is served with draft-mtp on its own, its counters show in `status --json`, and a head
whose drafts are never accepted (random weights) is shortened, then switched off."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

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


def test_mtp_is_chosen_watched_and_switched_off_when_it_never_pays(built_engine_home):
    target = cached_gguf(qwen35_target())
    port = free_port()
    env = {**os.environ, "LUCEBOX_HOME": str(engine_home())}
    argv = [sys.executable, "-m", "lucebox.app.cli", "serve", "--model", str(target)]
    serve = subprocess.Popen(
        [*argv, "--port", str(port), "--ctx", "2048"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        seen: list[dict] = []
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            now = status()
            if now["state"] == "ready" and now["url"] == url:
                seen.append(now)
                spec = now["spec"]
                if spec and spec["active"] is False:
                    break
                body = {"prompt": "hello world the model", "n_predict": 64, "temperature": 0}
                with httpx.Client(timeout=120) as client:
                    client.post(f"{url}/completion", json={**body, "ignore_eos": True})
            assert serve.poll() is None, serve.stdout.read() if serve.stdout else ""
            time.sleep(0.3)
        spec = seen[-1]["spec"]
        assert seen[0]["spec"]["type"] == "draft-mtp"
        assert any((s["spec"] or {}).get("acceptance") is not None for s in seen)
        assert spec["type"] == "draft-mtp" and spec["active"] is False
        assert "switched off" in spec["reason"] and "accepted" in spec["reason"]
        assert seen[-1]["restarts"] >= 2  # shortened once, then off: two planned restarts
        paths = resolve_paths({"LUCEBOX_HOME": str(engine_home())})
        log = engine_log(paths).read_text(errors="replace")
        assert "--spec-draft-n-max 2" in log  # the shortened launch ran before the plain one
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=60)
        assert serve.stdout is not None
        serve.stdout.close()
