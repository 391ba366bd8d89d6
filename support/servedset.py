"""A served set for slow tests and the switch benchmark: `lucebox serve --model A --model B ...`
on the built CPU engine, in a LUCEBOX_HOME of its own (the engine is linked in, not rebuilt)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from support.ggufgen import ModelSpec, cached_gguf
from support.ports import free_port
from support.realmodels import engine_home

THIRD_NAME = "tiny-llama"
"""The generated third model's alias (its file is copied to this name)."""


def third_model(folder: Path) -> Path:
    """A generated tiny llama with a chat template: the set's third model."""
    path = folder / f"{THIRD_NAME}.gguf"
    if not path.exists():
        shutil.copy(cached_gguf(ModelSpec()), path)
    return path


def home_with_engine(home: Path) -> Path:
    """``home`` with the built CPU engine of the test cache linked in."""
    engines = home / "data" / "engines"
    engines.parent.mkdir(parents=True, exist_ok=True)
    if not engines.exists():
        engines.symlink_to(engine_home() / "data" / "engines", target_is_directory=True)
    return home


@dataclass
class ServedSet:
    url: str
    env: dict[str, str]
    proc: subprocess.Popen[str]

    def status(self) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-m", "lucebox.app.cli", "status", "--json"],
            capture_output=True, text=True, env=self.env, check=False, timeout=60,
        )  # fmt: skip
        return dict(json.loads(done.stdout))

    def models(self) -> dict[str, dict[str, Any]]:
        """The status's models by alias."""
        return {m["alias"]: m for m in self.status().get("models", [])}

    def router_states(self) -> dict[str, str]:
        answer = httpx.get(self.url + "/models", timeout=10).json()
        # A side model is listed beside the router's models, with no router state.
        return {m["id"]: m["status"]["value"] for m in answer["data"] if "status" in m}

    def ask(
        self, model: str, max_tokens: int = 1, content: str = "Say hi"
    ) -> tuple[float, dict[str, Any]]:
        """One chat request naming ``model``: (seconds it took, the answer)."""
        started = time.perf_counter()
        answer = httpx.post(
            self.url + "/v1/chat/completions",
            json={
                "model": model,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": max_tokens,
                "temperature": 0,
            },
            timeout=300,
        )
        return time.perf_counter() - started, answer.json()

    def settled_models(
        self, settled: Callable[[dict[str, str]], bool], timeout_s: float = 15
    ) -> dict[str, dict[str, Any]]:
        """The status's models once their states are ``settled`` (the run samples each second),
        or as they are at the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            models = self.models()
            if settled({a: m["state"] for a, m in models.items()}) or time.monotonic() > deadline:
                return models
            time.sleep(0.3)

    def wait_states(self, wanted: dict[str, str], timeout_s: float) -> dict[str, str]:
        deadline = time.monotonic() + timeout_s
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = self.router_states()
            if all(states.get(alias) == state for alias, state in wanted.items()):
                return states
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {wanted}; router says {states}")


@contextlib.contextmanager
def served_set(
    home: Path, sources: list[str], settings: dict[str, str], timeout_s: float = 300
) -> Iterator[ServedSet]:
    """Serve ``sources`` with ``settings`` (config keys) in ``home`` until the block ends."""
    env = {**os.environ, "LUCEBOX_HOME": str(home_with_engine(home))}
    for key, value in settings.items():
        subprocess.run(
            [sys.executable, "-m", "lucebox.app.cli", "config", "set", key, value],
            env=env, check=True, capture_output=True, timeout=60,
        )  # fmt: skip
    port = free_port()
    argv = [sys.executable, "-m", "lucebox.app.cli", "serve", "--port", str(port)]
    for source in sources:
        argv += ["--model", source]
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    served = ServedSet(f"http://127.0.0.1:{port}", env, proc)
    try:
        deadline = time.monotonic() + timeout_s
        while served.status().get("state") != "ready" or not served.models():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(proc.stdout.read() if proc.stdout else "serve exited")
            time.sleep(0.5)
        yield served
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=90)
        if proc.stdout is not None:
            proc.stdout.close()
