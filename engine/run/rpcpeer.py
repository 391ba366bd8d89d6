"""`lucebox worker`: the engine's ggml-rpc-server on a peer, and what it publishes about it.

The RPC server has no authentication, so it binds loopback unless the user says otherwise;
beside it, on the next port, a small JSON endpoint tells the head which engine build this
is and how much memory is free (see engine/machine/peers.py). Stopping the worker stops the server.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType

import psutil

from lucebox.engine.core.address import is_loopback
from lucebox.engine.core.errors import RunError, UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines.registry import EngineManifest
from lucebox.engine.machine import gpu
from lucebox.engine.machine.peers import INFO_PORT_OFFSET, PeerInfo
from lucebox.engine.machine.ports import port_holder
from lucebox.engine.run.supervision.engineprocess import die_with_parent

RPC_SERVER = "ggml-rpc-server"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
RISK = (
    "the engine's RPC server has no authentication: anyone who can reach {host}:{port} can "
    "run work on this machine and read what it holds. Use it only on a network you trust, "
    "or keep the worker on 127.0.0.1 and reach it through an SSH tunnel (see the README)."
)


class WorkerError(RunError):
    """The RPC server would not start or stopped on its own."""


@dataclass(frozen=True)
class RpcPeerSetup:
    """What one worker runs: the engine's RPC server on ``host:port``, on a GPU or the CPU."""

    rpc_server_path: str
    host: str
    port: int
    gpu_index: int | None
    """NVML index of the GPU it offers; None offers the CPU and the RAM."""
    cache_dir: str
    """Where the server keeps tensors it was sent (``-c``), so a restart loads faster."""

    @property
    def info_port(self) -> int:
        return self.port + INFO_PORT_OFFSET


def worker_argv(spec: RpcPeerSetup) -> list[str]:
    """The ggml-rpc-server command line (tools/rpc/rpc-server.cpp of the pinned source)."""
    argv = [spec.rpc_server_path, "-H", spec.host, "-p", str(spec.port), "-c"]
    if spec.gpu_index is not None:
        # The server sees only this GPU (worker_env), so it is CUDA0 there.
        argv += ["-d", "CUDA0"]
    return argv


def worker_env(spec: RpcPeerSetup) -> dict[str, str]:
    env = {"LLAMA_CACHE": spec.cache_dir}
    if spec.gpu_index is not None:
        env |= {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(spec.gpu_index)}
    return env


def rpc_server_of(engine: EngineManifest | None) -> Path:
    """The engine's RPC server binary; a UsageError when this engine has none."""
    if engine is None:
        raise UsageError("no engine installed", hint="run `lucebox engine build` first")
    path = Path(engine.server_path).with_name(RPC_SERVER)
    if not engine.rpc or not path.is_file():
        raise UsageError(
            f"the engine {engine.id} has no {RPC_SERVER}",
            hint="build the engine again with `lucebox engine build` (every build includes it)",
        )
    return path


def make_setup(
    paths: Paths,
    engine: EngineManifest | None,
    probe: gpu.GpuProbe,
    *,
    host: str,
    port: int,
    gpu_index: int | None,
    allow_lan: bool,
) -> RpcPeerSetup:
    """Check the user's choices and the engine; the GPU defaults to the first one on a CUDA
    engine, the CPU otherwise."""
    if not is_loopback(host) and not allow_lan:
        raise UsageError(
            f"binding {host} puts an unauthenticated RPC server on the network",
            hint="keep 127.0.0.1 and use an SSH tunnel, or pass --allow-lan if you trust it",
        )
    if port + INFO_PORT_OFFSET > 65535:
        raise UsageError(f"port {port} leaves no room for the info port after it")
    server = rpc_server_of(engine)
    assert engine is not None
    indices = [g.index for g in probe.gpus]
    if gpu_index is not None and gpu_index not in indices:
        found = ", ".join(map(str, indices)) or "none"
        raise UsageError(
            f"there is no GPU {gpu_index} (NVIDIA GPUs here: {found})",
            hint="pick one from `lucebox doctor`, or leave --gpu out",
        )
    if gpu_index is not None and engine.backend != "cuda":
        raise UsageError(
            f"the engine {engine.id} is built for the CPU, so it cannot offer GPU {gpu_index}",
            hint="build a CUDA engine with `lucebox engine build --cuda`, or leave --gpu out",
        )
    if gpu_index is None and engine.backend == "cuda" and indices:
        gpu_index = indices[0]
    for taken in (port, port + INFO_PORT_OFFSET):
        holder = port_holder(host, taken)
        if holder is not None:
            raise UsageError(
                f"port {taken} on {host} is held by {holder}",
                hint="stop it or choose another --port (the worker uses --port and the next one)",
            )
    return RpcPeerSetup(str(server), host, port, gpu_index, str(paths.cache_dir / "llama.cpp"))


def published(spec: RpcPeerSetup, engine: EngineManifest) -> PeerInfo:
    """What the endpoint answers now: the build, and the memory free on the offered device."""
    if spec.gpu_index is not None:
        found = {g.index: g for g in gpu.probe_gpus().gpus}.get(spec.gpu_index)
        if found is not None:
            return PeerInfo(
                engine.version,
                engine.id,
                f"CUDA0: {found.name}",
                found.vram_free_bytes,
                found.vram_total_bytes,
                spec.port,
            )
    memory = psutil.virtual_memory()
    return PeerInfo(
        engine.version, engine.id, "CPU: system RAM", memory.available, memory.total, spec.port
    )


def _info_server(spec: RpcPeerSetup, engine: EngineManifest) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path not in ("/", "/info"):
                self.send_error(404)
                return
            body = json.dumps(published(spec, engine).to_json()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # the head asks often; the worker's log is the RPC server's

    family = socket.AF_INET6 if ":" in spec.host else socket.AF_INET

    class InfoServer(ThreadingHTTPServer):
        address_family = family

    try:
        return InfoServer((spec.host, spec.info_port), Handler)
    except OSError as exc:
        raise UsageError(
            f"cannot listen on {spec.host}:{spec.info_port}: {exc.strerror or exc}",
            hint="choose another --port (the worker uses --port and the next one)",
        ) from exc


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def run_worker(
    spec: RpcPeerSetup, engine: EngineManifest, log_path: Path, say: Callable[[str], None]
) -> int:
    """Run until SIGTERM/SIGINT (exit 0) or until the RPC server stops on its own (an error)."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    info = _info_server(spec, engine)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a", encoding="utf-8") as log:
        process = subprocess.Popen(
            worker_argv(spec),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **worker_env(spec)},
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
    thread = threading.Thread(target=info.serve_forever, name="worker-info", daemon=True)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _listening(spec.host, spec.port):
            if process.poll() is not None or stop.is_set() or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if process.poll() is None and not stop.is_set():
            if not _listening(spec.host, spec.port):
                raise WorkerError(
                    f"{RPC_SERVER} did not listen on {spec.host}:{spec.port} within "
                    f"{READY_TIMEOUT_S:.0f} s",
                    hint=f"see {log_path}",
                )
            thread.start()
            say(
                f"worker ready: RPC on {spec.host}:{spec.port}, info on "
                f"http://{spec.host}:{spec.info_port}/ ({published(spec, engine).device}, "
                f"engine {engine.id}); log: {log_path}"
            )
        while process.poll() is None and not stop.is_set():
            stop.wait(0.5)
        if stop.is_set():
            return 0
        tail = log_path.read_text("utf-8", errors="replace").splitlines()[-5:]
        raise WorkerError(
            f"{RPC_SERVER} exited ({process.returncode}): " + " | ".join(tail),
            hint=f"see {log_path}",
        )
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if thread.is_alive():
            info.shutdown()
        info.server_close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
