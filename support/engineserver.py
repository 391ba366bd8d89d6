"""Run the built llama-server directly on a generated model: for speculation tests and benches.

These start the engine by hand (not through ``lucebox serve``) so a test can name the exact
speculation flags it proves; each server gets a free port, a log file, and is stopped (SIGTERM,
then SIGKILL) however the block ends.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from lucebox.engine.run.kinds.metrics import parse_counters
from support.health import wait_healthy
from support.ports import free_port


@dataclass(frozen=True)
class RunningServer:
    url: str
    log_path: Path
    pid: int

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def complete(self, prompt: str, n_predict: int, **params: Any) -> dict[str, Any]:
        """A greedy ``/completion`` of exactly ``n_predict`` tokens; the reply has ``timings``."""
        body = {
            "prompt": prompt,
            "n_predict": n_predict,
            "temperature": 0,
            "ignore_eos": True,
            "cache_prompt": False,
            **params,
        }
        reply = httpx.post(f"{self.url}/completion", json=body, timeout=600)
        reply.raise_for_status()
        result: dict[str, Any] = reply.json()
        return result

    def counters(self) -> dict[str, float]:
        """The ``llamacpp:*`` series of ``/metrics`` (speculation counters among them)."""
        reply = httpx.get(f"{self.url}/metrics", timeout=30)
        reply.raise_for_status()
        return parse_counters(reply.text)


class ServerFailedError(Exception):
    """llama-server exited, or was not ready in time; the message ends with its log."""


def spec_args(mode: str, draft: Path | None = None, draft_max: int | None = None) -> list[str]:
    """llama-server flags for one speculation mode (``none`` adds nothing)."""
    if mode == "none":
        return []
    args = ["--spec-type", mode]
    if draft is not None:
        args += ["-md", str(draft)]
    if draft_max is not None:
        args += ["--spec-draft-n-max", str(draft_max)]
    return args


@contextmanager
def running_server(
    server_path: Path,
    model: Path,
    extra_args: Sequence[str] = (),
    *,
    threads: int = 2,
    ctx: int = 2048,
    ready_timeout_s: float = 180,
) -> Iterator[RunningServer]:
    """``llama-server -m model`` on one slot with metrics on, until the block ends; its log
    (``RunningServer.log``) lasts as long as the block."""
    port = free_port()
    with tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False) as log:
        log_path = Path(log.name)
    argv = [
        str(server_path), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
        "--metrics", "-np", "1", "-c", str(ctx), "-t", str(threads), "--no-webui",
        *extra_args,
    ]  # fmt: skip
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT)
    server = RunningServer(f"http://127.0.0.1:{port}", log_path, proc.pid)
    try:
        _wait_ready(proc, server, ready_timeout_s)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log_path.unlink(missing_ok=True)


def _wait_ready(proc: subprocess.Popen[bytes], server: RunningServer, timeout_s: float) -> None:
    if wait_healthy(server.url, timeout_s, proc, interval_s=0.05):
        return
    if proc.poll() is not None:
        raise ServerFailedError(f"llama-server exited {proc.returncode}:\n{server.log()[-4000:]}")
    raise ServerFailedError(f"llama-server not ready after {timeout_s} s:\n{server.log()[-4000:]}")


def exit_of(
    server_path: Path, model: Path, extra_args: Sequence[str] = (), timeout_s: float = 120
) -> tuple[int, str]:
    """Run llama-server on a model (or flags) it should refuse: its exit status and output."""
    argv = [str(server_path), "-m", str(model), "--port", str(free_port()), "-c", "512"]
    done = subprocess.run(
        [*argv, *extra_args], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    return done.returncode, done.stdout + done.stderr
