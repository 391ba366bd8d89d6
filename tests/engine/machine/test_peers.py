"""RPC peers: the split planner with peers (tables over scripted cards and published peer
info), the head asking real HTTP endpoints, and the refusals."""

from __future__ import annotations

import json

import pytest

from lucebox.engine.core.errors import GuardRefusal, UsageError
from lucebox.engine.core.units import GIB
from lucebox.engine.machine import peers
from lucebox.engine.machine.budget import GpuBudget, budget_for
from lucebox.engine.machine.gpu import probe_gpus
from lucebox.engine.machine.peers import Peer, PeerInfo
from lucebox.engine.plan.engineview import pinned_engine
from lucebox.engine.run.death import DeathFacts, name_death
from support.httpserver import Route, serve_files
from tests.engine.fake_nvml import FakeGpu, FakeNvml
from tests.engine.plan.test_memory_plan import _launch

BUILD = pinned_engine().version


def _peer(address: str, total_gib: float, used_gib: float, build: str = BUILD) -> Peer:
    total = int(total_gib * GIB)
    port = int(address.rpartition(":")[2])
    return Peer(
        address,
        PeerInfo(
            build, "llama.cpp-test", "CUDA0: RTX 3090", total - int(used_gib * GIB), total, port
        ),
    )


def _budget(cards: tuple[tuple[float, float], ...], found: tuple[Peer, ...]) -> GpuBudget:
    fakes = [FakeGpu(total_bytes=int(t * GIB), used_bytes=int(u * GIB)) for t, u in cards]
    return budget_for(probe_gpus(FakeNvml(gpus=fakes)), peers=peers.peer_devices(found))


@pytest.mark.parametrize(
    ("cards", "remote", "preset"),
    [
        (((24, 0.3),), ((24, 0.3),), "qwen3.6-27b-q6"),  # 24 + a 24 GB peer
        (((24, 0.3),), ((12, 0.3),), "qwen3.6-27b"),  # 24 + a 12 GB peer
        (((16, 0.3), (16, 0.3)), ((16, 0.3),), "qwen3.6-27b-q6"),  # 2 GPUs + a peer
        (((24, 22.5),), ((24, 0.3), (24, 0.3)), "qwen3.6-27b-q6"),  # the local card nearly full
        ((), ((12, 0.3), (12, 0.3)), "qwen3.6-27b"),  # no GPU here: the peers hold the layers
    ],
)
def test_split_planner_with_peers(cards, remote, preset):
    found = tuple(_peer(f"10.0.0.{i + 2}:50052", t, u) for i, (t, u) in enumerate(remote))
    launch = _launch(_budget(cards, found), preset)
    plan, argv, doc = launch.plan, launch.argv, launch.to_json()
    assert launch.refusal is None, launch.refusal
    # The engine numbers the RPC devices first, in --rpc order, then this PC's GPUs.
    names = [d["name"] for d in doc["devices"]]
    assert names[: len(found)] == [f"peer {p.address}: CUDA0: RTX 3090" for p in found]
    assert all(n.startswith("GPU ") for n in names[len(found) :])
    assert argv[argv.index("--rpc") + 1] == ",".join(p.address for p in found)
    assert doc["env"].get("CUDA_VISIBLE_DEVICES", "") == ",".join(str(i) for i in range(len(cards)))
    assert len(plan.tensor_split) == len(cards) + len(found)
    assert argv[argv.index("--tensor-split") + 1] == ",".join(f"{s:g}" for s in plan.tensor_split)
    assert sum(d["memory_bytes"] for d in doc["devices"]) == pytest.approx(
        plan.memory_bytes.total, abs=len(names)
    )
    frees = [p.info.free_bytes for p in found] + [int((t - u) * GIB) for t, u in cards]
    for device, free in zip(doc["devices"], frees, strict=True):
        assert device["memory_bytes"] <= free  # each device holds only its share
    shares = dict(zip(names, plan.tensor_split, strict=True))
    busiest = [n for n, f in zip(names, frees, strict=True) if f < 2 * GIB]
    assert all(shares[n] < 0.05 for n in busiest)  # a card full of other work gets little
    assert "spread over" in plan.reasons["split"]
    # Every layer offloaded: whole layer slots, n_layer + 1 with the output, as the engine
    # deals them out (src/llama-model.cpp), so each device's total is what it will hold.
    assert sum(plan.tensor_split) == launch.target.facts.n_layer + 1
    assert all(share == int(share) for share in plan.tensor_split)


def test_a_model_that_fits_one_gpu_still_uses_the_peers_asked_for():
    found = (_peer("10.0.0.2:50052", 24, 0.3),)
    launch = _launch(_budget(((24, 0.3),), found), "qwen3-14b")
    assert "--rpc" in launch.argv and len(launch.plan.tensor_split) == 2


def test_one_peer_and_no_gpu_needs_no_split():
    found = (_peer("10.0.0.2:50052", 24, 0.3),)
    launch = _launch(_budget((), found), "qwen3-14b")
    assert launch.argv[launch.argv.index("--rpc") + 1] == "10.0.0.2:50052"
    assert (
        "--tensor-split" not in launch.argv and launch.argv[launch.argv.index("-ngl") + 1] == "all"
    )
    assert launch.to_json()["env"] == {}


def _endpoint(info: PeerInfo) -> Route:
    return Route(json.dumps(info.to_json()).encode(), "application/json")


def test_the_head_learns_a_peer_from_its_endpoint():
    with serve_files() as server:
        port = int(server.base_url.rpartition(":")[2]) - peers.INFO_PORT_OFFSET
        published = PeerInfo(BUILD, "llama.cpp-x", "CPU: system RAM", 3 * GIB, 8 * GIB, port)
        server.routes["/"] = _endpoint(published)
        (peer,) = peers.ask_peers((f"127.0.0.1:{port}",))
    assert peer.info == published
    peers.check_builds((peer,), BUILD)


def test_a_peer_with_another_build_is_refused_naming_both():
    other = "0.5.9 (build 10000, commit 0123456789ab)"
    with serve_files() as server:
        port = int(server.base_url.rpartition(":")[2]) - peers.INFO_PORT_OFFSET
        server.routes["/"] = _endpoint(
            PeerInfo(other, "llama.cpp-old", "CPU: system RAM", GIB, GIB, port)
        )
        found = peers.ask_peers((f"127.0.0.1:{port}",))
    with pytest.raises(GuardRefusal) as refused:
        peers.check_builds(found, BUILD)
    assert refused.value.exit_code == 3
    assert other in refused.value.message and BUILD in refused.value.message
    assert f"127.0.0.1:{port}" in refused.value.message


def test_a_peer_that_does_not_answer_is_named():
    from support.ports import free_port

    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(UsageError, match=f"the peer {address} does not answer"):
        peers.ask_peers((address,), timeout_s=2.0)


def test_something_else_on_the_port_is_not_taken_for_a_worker():
    with serve_files({"/": Route(b"<html>hi</html>", "text/html")}) as server:
        port = int(server.base_url.rpartition(":")[2]) - peers.INFO_PORT_OFFSET
        with pytest.raises(UsageError, match="not as a lucebox worker"):
            peers.ask_peers((f"127.0.0.1:{port}",))


@pytest.mark.parametrize("text", ["host", "host:", ":50052", "host:port", "h:0", "h:65535"])
def test_bad_peer_addresses(text):
    with pytest.raises(UsageError, match="is not a peer address"):
        peers.split_address(text)


def test_ipv6_peer_address():
    assert peers.split_address("[::1]:50052") == ("::1", 50052)
    assert peers.info_url("[::1]:50052") == "http://[::1]:50053/"


def test_lost_peer_diagnosis_names_it():
    # ggml-rpc.cpp aborts through RPC_STATUS_ASSERT with this line when a peer goes away.
    lines = ["srv  update_slots: ...", "/src/ggml-rpc.cpp:566: GGML_ABORT: Remote RPC server "
             "crashed or returned malformed response"]  # fmt: skip
    lost = name_death(-6, lines, DeathFacts(down_peers=("127.0.0.1:50060",)))
    assert lost.code == "rpc-peer" and "127.0.0.1:50060" in lost.sentence
    line = "ggml-rpc.cpp:547: Failed to connect to 10.0.0.9:50052"
    unreachable = name_death(-6, [line], DeathFacts())
    assert unreachable.code == "rpc-peer" and "10.0.0.9:50052" in unreachable.sentence
