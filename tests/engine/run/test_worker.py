"""`lucebox worker` before it starts anything: the command line, the checks, what it publishes.
Running it with the real engine is tests/app/test_rpc_e2e.py."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from lucebox.engine.core.errors import UsageError
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.engines.registry import EngineCapabilities, EngineManifest
from lucebox.engine.machine.gpu import probe_gpus
from lucebox.engine.machine.peers import PeerInfo
from lucebox.engine.run import rpcpeer
from support.ports import free_port_pair
from tests.engine.fake_nvml import FakeGpu, FakeNvml


def _engine(folder: Path, backend: str = "cpu", rpc: bool = True) -> EngineManifest:
    server = folder / "bin" / "llama-server"
    server.parent.mkdir(parents=True, exist_ok=True)
    server.write_text("")
    if rpc:
        (folder / "bin" / "ggml-rpc-server").write_text("")
    return EngineManifest(
        id=f"llama.cpp-b11434-{backend}-0000",
        backend="cuda" if backend == "cuda" else "cpu",
        cuda_archs=("86",) if backend == "cuda" else (),
        version="0.6.0-dev (build 11434, commit b0a2feb64c6f)",
        server_path=str(server),
        origin="build",
        options={"backend": "cpu", "cpu_target": "x86-64-v3"},
        capabilities=EngineCapabilities((), (), None),
        rpc=rpc,
    )


def _spec(
    tmp_path: Path, engine: EngineManifest | None = None, **choices: object
) -> rpcpeer.RpcPeerSetup:
    engine = engine or _engine(tmp_path)
    probe = probe_gpus(FakeNvml(gpus=[FakeGpu()] if engine.backend == "cuda" else []))
    options: dict = {"host": "127.0.0.1", "port": free_port_pair(), "gpu_index": None}
    options |= {"allow_lan": False, **choices}
    return rpcpeer.make_setup(resolve_paths(), engine, probe, **options)


def test_cpu_worker_runs_the_rpc_server_on_loopback_with_its_cache(tmp_path):
    spec = _spec(tmp_path)
    argv = rpcpeer.worker_argv(spec)
    assert argv[0].endswith("ggml-rpc-server")
    assert argv[1:] == ["-H", "127.0.0.1", "-p", str(spec.port), "-c"]
    assert rpcpeer.worker_env(spec) == {"LLAMA_CACHE": spec.cache_dir}


def test_gpu_worker_sees_only_its_gpu_as_cuda0(tmp_path):
    spec = _spec(tmp_path, engine=_engine(tmp_path, "cuda"), gpu_index=0)
    assert rpcpeer.worker_argv(spec)[-2:] == ["-d", "CUDA0"]
    env = rpcpeer.worker_env(spec)
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_a_cuda_engine_offers_the_first_gpu_by_default(tmp_path):
    assert _spec(tmp_path, engine=_engine(tmp_path, "cuda")).gpu_index == 0


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"host": "0.0.0.0"}, "unauthenticated RPC server"),
        ({"gpu_index": 3}, "there is no GPU 3"),
        ({"port": 65535}, "no room for the info port"),
    ],
)
def test_bad_choices_are_refused(tmp_path, overrides, fragment):
    with pytest.raises(UsageError, match=fragment):
        _spec(tmp_path, **overrides)


def test_an_engine_without_the_rpc_server_is_refused(tmp_path):
    with pytest.raises(UsageError, match="has no ggml-rpc-server"):
        _spec(tmp_path, engine=_engine(tmp_path, rpc=False))
    with pytest.raises(UsageError, match="no engine installed"):
        rpcpeer.rpc_server_of(None)


def test_a_taken_port_is_named(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(UsageError, match=f"port {port} on 127.0.0.1 is held"):
            _spec(tmp_path, port=port)


def test_lan_with_allow_lan_is_accepted(tmp_path):
    assert _spec(tmp_path, host="0.0.0.0", allow_lan=True).host == "0.0.0.0"


def test_a_cpu_worker_publishes_its_build_and_free_ram(tmp_path):
    engine = _engine(tmp_path)
    spec = _spec(tmp_path, engine=engine)
    info = rpcpeer.published(spec, engine)
    assert info.build == engine.version and info.engine_id == engine.id
    assert info.device == "CPU: system RAM" and 0 < info.free_bytes <= info.total_bytes
    assert PeerInfo.from_json(info.to_json()) == info
