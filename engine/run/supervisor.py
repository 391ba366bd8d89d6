"""Supervise llama-server: start it, know when it is ready, bring it back, say why it died.

The engine runs in its own process group with a parent-death signal, so it cannot outlive
lucebox; its output goes to a rotating log file and an in-memory ring for the UI. Events are
an async iterator that the CLI and the TUI both consume.

``events`` is one state machine (start, loading, ready, exit, backoff, give up) and reads best
whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
import signal
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx
import psutil

from lucebox.engine.core.errors import RunError
from lucebox.engine.plan.launch import LaunchSpec, engine_environ, server_argv, url_of
from lucebox.engine.run.enginerun import engine_run

EventKind = Literal["starting", "loading", "ready", "exited", "restarting", "gave-up", "stopped"]
LOG_ROTATE_BYTES = 16 * 1024 * 1024
LOG_KEEP = 3
RING_LINES = 2000
STOP_TIMEOUT_S = 15.0
HEALTH_INTERVAL_S = 0.05
"""While loading, the engine answers /health with 503 in well under a millisecond: asking
often costs nothing and lets ready follow the engine closely."""
_PR_SET_PDEATHSIG = 1

_DIAGNOSES: list[tuple[str, str, str]] = [
    (
        "oom",
        r"out of memory|failed to allocate|unable to allocate (CUDA|Vulkan)\d* buffer",
        "the GPU ran out of memory while loading: pick a smaller preset or ask for less --ctx",
    ),
    (
        "truncated",
        r"data is not within the file bounds|model is corrupted or incomplete",
        "the model file is truncated or damaged: run `lucebox models verify` and pull it again",
    ),
    (
        "unknown-arch",
        r"unknown model architecture",
        "the engine does not know this model's architecture: build a newer engine",
    ),
    (
        "bad-flag",
        r"error: invalid argument|error while handling argument|unknown argument"
        r"|\[server\] unknown option",
        "the engine refused a command-line flag",
    ),
    (
        "port-in-use",
        r"couldn't bind HTTP server socket",
        "the port is taken: stop the other program or choose --port",
    ),
    (
        "model-load",
        r"exiting due to model loading error|failed to load model"
        r"|target load: |draft load: |backend creation failed",
        "the model failed to load",
    ),
]


@dataclass(frozen=True)
class ServerEvent:
    kind: EventKind
    message: str
    pid: int | None = None
    diagnosis: str | None = None
    """A stable code: oom, truncated, unknown-arch, bad-flag, port-in-use, model-load,
    rpc-peer."""
    restarts: int = 0
    ctx: int | None = None
    """The context this engine serves (a re-plan after running out of memory changes it)."""


class PortInUseError(RunError):
    """The port is held by another program."""


# The engine's RPC client (ggml/src/ggml-rpc/ggml-rpc.cpp of the pinned source) aborts with
# these: a peer gone while serving (RPC_STATUS_ASSERT, no address in the line) and a peer
# not answering at start (GGML_ABORT with the endpoint).
_RPC_LOST = r"Remote RPC server crashed or returned malformed response"
_RPC_UNREACHABLE = r"Failed to connect to (\S+)|RPC handshake failed for (\S+)"


def diagnose(lines: list[str], down_peers: tuple[str, ...] = ()) -> tuple[str | None, str]:
    """The most specific known cause in the engine's last lines, and a sentence for it.

    ``down_peers`` are the RPC peers that did not answer after the exit: the engine's own
    line for a peer lost mid-serve does not say which one it was.
    """
    text = "\n".join(lines)
    unreachable = re.search(_RPC_UNREACHABLE, text)
    if unreachable:
        peer = unreachable.group(1) or unreachable.group(2)
        return "rpc-peer", (
            f"the RPC peer {peer} does not answer: start `lucebox worker` there, "
            "or serve without it (--rpc / rpc.peers)"
        )
    if re.search(_RPC_LOST, text):
        which = ", ".join(down_peers) if down_peers else "one of the RPC peers"
        return "rpc-peer", (
            f"lost the RPC peer {which} while serving (its worker stopped or the network "
            "dropped): start `lucebox worker` there again, or serve without it"
        )
    for code, pattern, sentence in _DIAGNOSES:
        if re.search(pattern, text, re.IGNORECASE):
            return code, sentence
    return None, "the engine exited; see the log"


def down_peers(addresses: tuple[str, ...]) -> tuple[str, ...]:
    """The RPC peers whose server does not accept a connection now."""
    down = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                pass
        except (OSError, ValueError):
            down.append(address)
    return tuple(down)


def port_holder(host: str, port: int) -> str | None:
    """Who holds ``host:port`` (as text), or None when it is free."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with contextlib.suppress(OSError):
            probe.bind((host, port))
            return None
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
                if conn.pid:
                    with contextlib.suppress(psutil.Error):
                        return f"{psutil.Process(conn.pid).name()} (pid {conn.pid})"
                return "another program"
    return "another program"


def die_with_parent() -> None:
    # The engine gets SIGKILL when lucebox dies, even by SIGKILL: no orphaned GPU holder.
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class RotatingLog:
    """Append-only log file that rotates at a size, keeping a few old files."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = path.open("a", encoding="utf-8")

    def write(self, line: str) -> None:
        self.handle.write(line + "\n")
        self.handle.flush()
        if self.handle.tell() > LOG_ROTATE_BYTES:
            self.handle.close()
            for index in range(LOG_KEEP - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{index}")
                if older.exists():
                    older.rename(self.path.with_name(f"{self.path.name}.{index + 1}"))
            self.path.rename(self.path.with_name(f"{self.path.name}.1"))
            self.handle = self.path.open("a", encoding="utf-8")

    def close(self) -> None:
        self.handle.close()


@dataclass
class RestartPolicy:
    max_crashes: int = 5
    window_s: float = 600.0
    first_backoff_s: float = 1.0
    max_backoff_s: float = 30.0


class Supervisor:
    """Runs one engine process at a time and reports what happens to it."""

    def __init__(
        self,
        spec: LaunchSpec,
        log_path: Path,
        *,
        ready_timeout_s: float,
        policy: RestartPolicy | None = None,
        replan_on_oom: Callable[[LaunchSpec], LaunchSpec | None] | None = None,
    ) -> None:
        self.spec = spec
        self.log = RotatingLog(log_path)
        self.ring: deque[str] = deque(maxlen=RING_LINES)
        self.lines_total = 0
        """Lines the engine has written so far; a viewer shows the ring's last new ones."""
        self.ready_timeout_s = ready_timeout_s
        self.policy = policy or RestartPolicy()
        self.replan_on_oom = replan_on_oom
        self.process: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.started_at = time.time()
        self.on_line: Callable[[int, str], None] | None = None
        """Called with the engine's pid and each line it writes, as it writes it."""
        self.before_stop: Callable[[], Awaitable[None]] | None = None
        """Awaited before a live engine is stopped on purpose (stop, restart, not ready)."""
        self._stopping = asyncio.Event()
        self._restart_asked = asyncio.Event()
        self._restart_spec: LaunchSpec | None = None
        self._crash_times: list[float] = []
        self._oom_retried = False

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    async def _pump(self, engine_pid: int, stream: asyncio.StreamReader) -> None:
        while raw := await stream.readline():
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            self.ring.append(line)
            self.lines_total += 1
            self.log.write(line)
            if self.on_line is not None:
                self.on_line(engine_pid, line)

    async def _wait_ready(self, process: asyncio.subprocess.Process) -> bool:
        url = url_of(self.spec) + "/health"
        deadline = time.monotonic() + self.ready_timeout_s
        async with httpx.AsyncClient(timeout=2.0) as client:
            while time.monotonic() < deadline and process.returncode is None:
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(url)).status_code == 200:
                        return await self._warmed_up(client)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), HEALTH_INTERVAL_S)
                    return False
        return False

    async def _warmed_up(self, client: httpx.AsyncClient) -> bool:
        """The engine's own warm-up (:meth:`EngineRun.warm_up`) passes before it counts as
        ready, so a failure it provokes comes now, not to a user."""
        run = engine_run(self.spec.kind)
        failure = await run.warm_up(client, url_of(self.spec))
        if run.sends_warm_up:
            self.log.write(f"# lucebox: warm-up {'answered' if failure is None else failure}")
        return failure is None

    async def events(self) -> AsyncIterator[ServerEvent]:
        """Start the engine and keep it up until ``stop`` or a crash loop; yield what happens."""
        try:
            while not self._stopping.is_set():
                holder = port_holder(self.spec.host, self.spec.port)
                if holder is not None:
                    yield ServerEvent(
                        "gave-up",
                        f"port {self.spec.port} is held by {holder}",
                        diagnosis="port-in-use",
                        restarts=self.restarts,
                    )
                    return
                argv = server_argv(self.spec)
                self.log.write(f"# lucebox: starting {' '.join(argv)}")
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    env=engine_environ(self.spec, os.environ),
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
                self.process = process
                assert process.stdout is not None
                pump = asyncio.create_task(self._pump(process.pid, process.stdout))
                yield ServerEvent(
                    "starting",
                    f"engine started (pid {process.pid}, ctx {self.spec.plan.ctx})",
                    process.pid,
                    restarts=self.restarts,
                    ctx=self.spec.plan.ctx,
                )
                yield ServerEvent(
                    "loading", "loading the model", process.pid, restarts=self.restarts
                )
                ready = await self._wait_ready(process)
                if ready:
                    yield ServerEvent(
                        "ready",
                        f"serving at {url_of(self.spec)}",
                        process.pid,
                        restarts=self.restarts,
                    )
                    stop_wait = asyncio.create_task(self._stopping.wait())
                    restart_wait = asyncio.create_task(self._restart_asked.wait())
                    exit_wait = asyncio.create_task(process.wait())
                    await asyncio.wait(
                        {stop_wait, restart_wait, exit_wait}, return_when=asyncio.FIRST_COMPLETED
                    )
                    stop_wait.cancel()
                    restart_wait.cancel()
                    if self._restart_asked.is_set() and not self._stopping.is_set():
                        self._restart_asked.clear()
                        await self._terminate(process)
                        await pump
                        asked, self._restart_spec = self._restart_spec, None
                        yield self._relaunch(
                            asked or self.spec, "restarting as asked", process.pid, None
                        )
                        continue
                if self._stopping.is_set():
                    await self._terminate(process)
                    await pump
                    yield ServerEvent(
                        "stopped", "engine stopped", process.pid, restarts=self.restarts
                    )
                    return
                if process.returncode is None:  # never became ready in time
                    await self._terminate(process)
                await pump
                code, sentence = diagnose(list(self.ring)[-60:], down_peers(self.spec.rpc))
                yield ServerEvent(
                    "exited",
                    f"engine exited ({process.returncode}): {sentence}",
                    process.pid,
                    code,
                    self.restarts,
                )
                next_spec = self._after_crash(code)
                if next_spec is None:
                    yield ServerEvent(
                        "gave-up",
                        f"gave up after {len(self._crash_times)} crashes in "
                        f"{self.policy.window_s:.0f} s: {sentence}",
                        process.pid,
                        code,
                        self.restarts,
                    )
                    return
                backoff = min(
                    self.policy.max_backoff_s,
                    self.policy.first_backoff_s * 2 ** (len(self._crash_times) - 1),
                )
                if next_spec is not self.spec:
                    message = (
                        f"out of memory: retrying once at a smaller context "
                        f"({next_spec.plan.ctx} tokens)"
                    )
                else:
                    message = f"restarting in {backoff:.0f} s"
                yield self._relaunch(next_spec, message, process.pid, code)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), backoff)
        finally:
            if self.process is not None and self.process.returncode is None:
                await self._terminate(self.process)
            self.log.close()

    def _relaunch(
        self, spec: LaunchSpec, message: str, pid: int | None, code: str | None
    ) -> ServerEvent:
        """Every restart, asked for or after a crash: the next engine runs ``spec``."""
        self.spec = spec
        self.restarts += 1
        return ServerEvent("restarting", message, pid, code, self.restarts)

    def _after_crash(self, code: str | None) -> LaunchSpec | None:
        now = time.monotonic()
        self._crash_times = [t for t in self._crash_times if now - t < self.policy.window_s]
        self._crash_times.append(now)
        if code == "oom" and self.replan_on_oom is not None:
            if self._oom_retried:
                return None  # the re-planned launch ran out of memory too: do not hammer it
            self._oom_retried = True
            return self.replan_on_oom(self.spec)
        if code in ("truncated", "unknown-arch", "bad-flag", "port-in-use"):
            return None  # the same command fails the same way: do not hammer it
        if len(self._crash_times) >= self.policy.max_crashes:
            return None
        return self.spec

    async def _terminate(self, process: asyncio.subprocess.Process) -> None:
        """SIGTERM the engine's process group, wait, then SIGKILL."""
        if process.returncode is not None:
            return
        if self.before_stop is not None:
            await self.before_stop()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()

    @property
    def stop_requested(self) -> bool:
        return self._stopping.is_set()

    def stop(self) -> None:
        """Stop the engine and end :meth:`events`; serverrun.ServerRun.stop is the caller."""
        self._stopping.set()

    def restart(self, spec: LaunchSpec | None = None) -> None:
        """Stop the serving engine and start it again, with ``spec`` when given (no crash
        counted, no backoff); serverrun.ServerRun.restart is the caller."""
        self._restart_spec = spec
        self._restart_asked.set()
