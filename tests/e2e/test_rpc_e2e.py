"""Two `lucebox worker` processes on loopback and `lucebox serve --rpc` serving the real
SmolLM2 instruct model across them on the CPU engine; a worker killed mid-serve is named."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import httpx
import psutil
import pytest

from support.ports import free_port, free_port_pair
from support.realmodels import smol_model
from tests.conftest import alive, run_lucebox

pytestmark = pytest.mark.slow
READY_TIMEOUT_S = 300.0


class Lines:
    """A child's output, read on a thread so the test can wait for a line."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str] = queue.Queue()
        assert proc.stdout is not None
        self._proc = proc
        self._thread = threading.Thread(target=self._pump, args=(proc.stdout,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._thread.join(timeout=30)
        assert self._proc.stdout is not None
        self._proc.stdout.close()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line)

    def wait_for(self, fragment: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            self.seen.append(line)
            if fragment in line:
                return line
        raise AssertionError(f"no {fragment!r} in {''.join(self.seen)[-3000:]}")


def _start(args: list[str], home: Path) -> tuple[subprocess.Popen[str], Lines]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "lucebox.app.cli", *args],
        env={**os.environ, "LUCEBOX_HOME": str(home)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, Lines(proc)


def _stop(proc: subprocess.Popen[str], lines: Lines) -> int:
    """SIGTERM, then the exit code once its output is read to the end."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=60)
    lines.close()
    return code


@pytest.fixture
def home(built_engine_home, tmp_path):
    """A home of its own (one server per home) sharing the built engine."""
    own = tmp_path / "home"
    (own / "data").mkdir(parents=True)
    (own / "data" / "engines").symlink_to(built_engine_home / "data" / "engines")
    return own


def _rpc_children(pid: int) -> list[psutil.Process]:
    return [c for c in psutil.Process(pid).children() if "rpc-server" in c.name()]


def test_serve_across_two_workers_and_name_the_one_that_dies(home):
    ports = [free_port_pair(), free_port_pair()]
    workers = [_start(["worker", "--port", str(p)], home) for p in ports]
    served: tuple[subprocess.Popen[str], Lines] | None = None
    rpc_servers: list[psutil.Process] = []
    try:
        for (proc, lines), port in zip(workers, ports, strict=True):
            lines.wait_for(f"worker ready: RPC on 127.0.0.1:{port}", 60)
            rpc_servers += _rpc_children(proc.pid)
        assert len(rpc_servers) == 2
        peers = ",".join(f"127.0.0.1:{p}" for p in ports)
        info = httpx.get(f"http://127.0.0.1:{ports[0] + 1}/", timeout=10).json()
        assert info["build"] and info["free_bytes"] > 0 and info["rpc_port"] == ports[0]

        http_port = free_port()
        model = smol_model()
        served = _start(
            ["serve", "--model", str(model), "--port", str(http_port), "--ctx", "2048",
             "--rpc", peers],
            home,
        )  # fmt: skip
        out = served[1]
        out.wait_for("serving at", READY_TIMEOUT_S)
        status = json.loads(run_lucebox("status", "--json", env={"LUCEBOX_HOME": str(home)}).stdout)
        engine = psutil.Process(status["engine_pid"])
        argv = engine.cmdline()
        assert argv[argv.index("--rpc") + 1] == peers
        assert len(argv[argv.index("--tensor-split") + 1].split(",")) == 2
        # Both workers hold layers: the engine keeps a connection open to each RPC server.
        remote = {c.raddr.port for c in engine.net_connections("tcp") if c.raddr}
        assert set(ports) <= remote
        reply = httpx.post(
            f"http://127.0.0.1:{http_port}/v1/chat/completions",
            timeout=120,
            json={"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8},
        ).json()
        assert reply["usage"]["completion_tokens"] > 0

        # A worker killed mid-serve: the next request loses the peer, the diagnosis names it.
        dying, _ = workers[1]
        dying.kill()
        dying.wait(timeout=30)
        rpc_servers[1].wait(timeout=30)  # it dies with its worker (parent-death signal)
        with pytest.raises(httpx.HTTPError):
            httpx.post(
                f"http://127.0.0.1:{http_port}/v1/chat/completions",
                timeout=120,
                json={"messages": [{"role": "user", "content": "Again."}], "max_tokens": 8},
            ).raise_for_status()
        line = out.wait_for("engine exited", 120)
        assert f"127.0.0.1:{ports[1]}" in line and "RPC peer" in line, line
    finally:
        if served is not None:
            _stop(*served)
        for proc, lines in workers:
            _stop(proc, lines)
    survivor, _ = workers[0]
    assert survivor.returncode == 0
    assert not any(alive(p.pid) for p in rpc_servers)  # no orphaned RPC server
