"""`--rpc` on the command line: peers join the plan; a silent peer, another build, refused."""

from __future__ import annotations

import json

from lucebox.engine.core.units import GIB
from lucebox.engine.machine.peers import INFO_PORT_OFFSET, PeerInfo
from lucebox.engine.plan.engineview import pinned_engine
from support.httpserver import Route, serve_files
from support.ports import free_port
from tests.conftest import assert_one_line_error, run_lucebox


def _worker_route(build: str, port: int) -> Route:
    info = PeerInfo(build, "llama.cpp-peer", "CUDA0: RTX 3090", 23 * GIB, 24 * GIB, port)
    return Route(json.dumps(info.to_json()).encode(), "application/json")


def test_plan_adds_the_peer_before_the_cards():
    with serve_files() as server:
        port = int(server.base_url.rpartition(":")[2]) - INFO_PORT_OFFSET
        server.routes["/"] = _worker_route(pinned_engine().version, port)
        result = run_lucebox(
            "plan", "--preset", "qwen3.6-27b-q6", "--vram-mib", "12288",
            "--rpc", f"127.0.0.1:{port}", "--json",
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert [d["name"] for d in plan["devices"]] == [
        f"peer 127.0.0.1:{port}: CUDA0: RTX 3090",
        "a 12288 MiB card",
    ]
    assert plan["argv"][plan["argv"].index("--rpc") + 1] == f"127.0.0.1:{port}"
    assert len(plan["tensor_split"]) == 2 and plan["tensor_split"][0] > plan["tensor_split"][1]


def test_another_build_is_refused_with_exit_3():
    with serve_files() as server:
        port = int(server.base_url.rpartition(":")[2]) - INFO_PORT_OFFSET
        server.routes["/"] = _worker_route("0.5.0 (build 9000, commit 000000000000)", port)
        result = run_lucebox("plan", "--preset", "smoke", "--rpc", f"127.0.0.1:{port}")
    assert result.returncode == 3
    assert_one_line_error(result)
    assert "build 9000" in result.stderr and pinned_engine().version in result.stderr


def test_a_silent_peer_is_named_with_exit_2():
    address = f"127.0.0.1:{free_port()}"
    result = run_lucebox("plan", "--preset", "smoke", "--rpc", address)
    assert result.returncode == 2
    assert_one_line_error(result)
    assert f"the peer {address} does not answer" in result.stderr


def test_a_bad_address_is_a_usage_error():
    result = run_lucebox("plan", "--preset", "smoke", "--rpc", "somehost")
    assert result.returncode == 2 and "is not a peer address" in result.stderr


def test_worker_refuses_the_lan_without_allow_lan():
    result = run_lucebox("worker", "--host", "0.0.0.0")
    assert result.returncode == 2
    assert_one_line_error(result)
    assert "unauthenticated RPC server" in result.stderr and "--allow-lan" in result.stderr


def test_the_tui_preset_table_is_planned_with_the_peers_of_the_launch(tmp_path, monkeypatch):
    # rpc.peers in config.toml: the first-run table and the launch see the same budget.
    from lucebox.app.tui.backend import Backend
    from lucebox.engine.core.paths import resolve_paths
    from lucebox.engine.machine import config
    from lucebox.engine.pipeline import machine_view
    from lucebox.engine.plan.options import ServeOptions

    monkeypatch.setenv("LUCEBOX_HOME", str(tmp_path))
    paths = resolve_paths()
    with serve_files() as server:
        port = int(server.base_url.rpartition(":")[2]) - INFO_PORT_OFFSET
        server.routes["/"] = _worker_route(pinned_engine().version, port)
        config.set_setting(paths, "rpc.peers", f"127.0.0.1:{port}")
        table = Backend(paths).preset_table(ServeOptions())
        launch_budget = machine_view(paths, ServeOptions()).budget
    assert table.budget == launch_budget
    assert [d.address for d in table.budget.devices] == [f"127.0.0.1:{port}"]
    assert table.budget.vram_free_bytes == 23 * GIB
