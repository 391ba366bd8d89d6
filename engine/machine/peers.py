"""RPC peers: what a `lucebox worker` publishes, and the head asking its peers for it.

A worker runs the engine's ``ggml-rpc-server`` on ``host:port`` and answers ``GET /`` on
``host:port+1`` with ``PeerInfo`` as JSON. The head asks each peer before planning: the free
memory joins the budget, and a peer built from another engine is refused (the engine's own
RPC handshake compares only its protocol version, not the build).
"""

from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from lucebox.engine.core.errors import GuardRefusal, UsageError
from lucebox.engine.machine.budget import DeviceBudget

DEFAULT_RPC_PORT = 50052
INFO_PORT_OFFSET = 1
"""The JSON endpoint listens on the RPC port + 1, on the same host."""
ASK_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class PeerInfo:
    """What a worker publishes about itself (the JSON of its endpoint)."""

    build: str
    """The engine's version line (``--version``): both ends must print the same."""
    engine_id: str
    device: str
    """The device its RPC server offers, e.g. ``CUDA0: NVIDIA H100`` or ``CPU: system RAM``."""
    free_bytes: int
    total_bytes: int
    rpc_port: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PeerInfo:
        return cls(
            build=str(data["build"]),
            engine_id=str(data["engine_id"]),
            device=str(data["device"]),
            free_bytes=int(data["free_bytes"]),
            total_bytes=int(data["total_bytes"]),
            rpc_port=int(data["rpc_port"]),
        )


@dataclass(frozen=True)
class Peer:
    """One peer as the head knows it: its address and what it published."""

    address: str
    info: PeerInfo


def split_address(text: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) -> (host, port); a clear UsageError otherwise."""
    host, sep, port_text = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65535:
        raise UsageError(
            f"{text!r} is not a peer address",
            hint=f"write HOST:PORT, e.g. 192.168.1.20:{DEFAULT_RPC_PORT} (the worker's --port)",
        )
    return host, int(port_text)


def info_url(address: str) -> str:
    host, port = split_address(address)
    shown = f"[{host}]" if _is_v6(host) else host
    return f"http://{shown}:{port + INFO_PORT_OFFSET}/"


def _is_v6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


def ask_peer(address: str, timeout_s: float = ASK_TIMEOUT_S) -> Peer:
    """What the worker at ``address`` publishes; a UsageError naming it when it does not."""
    url = info_url(address)
    try:
        response = httpx.get(url, timeout=timeout_s)
        response.raise_for_status()
        info = PeerInfo.from_json(response.json())
    except httpx.HTTPError as exc:
        raise UsageError(
            f"the peer {address} does not answer ({url}: {exc})",
            hint=f"start `lucebox worker --port {split_address(address)[1]}` there, "
            "or leave it out of --rpc / rpc.peers",
        ) from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(
            f"the peer {address} answered, but not as a lucebox worker ({url})",
            hint="check the address: it is the worker's --port, its info is on the next port",
        ) from exc
    return Peer(address, info)


def ask_peers(addresses: tuple[str, ...], timeout_s: float = ASK_TIMEOUT_S) -> tuple[Peer, ...]:
    return tuple(ask_peer(address, timeout_s) for address in addresses)


def check_builds(peers: tuple[Peer, ...], build: str) -> None:
    """Refuse a peer whose engine is another build than the head's (``build``)."""
    for peer in peers:
        if peer.info.build != build:
            raise GuardRefusal(
                f"the peer {peer.address} runs engine build {peer.info.build!r}, "
                f"this machine runs {build!r}",
                hint="build the same engine on both (`lucebox engine build`), then start the "
                "worker again",
            )


def peer_devices(peers: tuple[Peer, ...]) -> tuple[DeviceBudget, ...]:
    """The peers as devices of a budget, in --rpc order (the engine numbers them so)."""
    return tuple(
        DeviceBudget(
            position, p.info.device, p.info.total_bytes, p.info.free_bytes, address=p.address
        )
        for position, p in enumerate(peers)
    )
