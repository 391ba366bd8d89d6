"""Ports on this machine: whether one is free, who holds it, the next free one, and whether
the RPC peers' servers accept a connection."""

from __future__ import annotations

import contextlib
import socket

import psutil


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


FREE_PORT_SEARCH = 100
"""Ports above a taken one tried for a free one to offer: the next free is the one a person
expects, and a hundred taken in a row means something else is wrong."""


def port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def next_free_port(host: str, port: int) -> int | None:
    """The first port above ``port`` free on ``host`` now; None when none near it is."""
    last = min(port + FREE_PORT_SEARCH, 65535)
    return next((p for p in range(port + 1, last + 1) if port_free(host, p)), None)


def port_holder(host: str, port: int) -> str | None:
    """Who holds ``host:port`` (as text), or None when it is free."""
    if port_free(host, port):
        return None
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
                if conn.pid:
                    with contextlib.suppress(psutil.Error):
                        return f"{psutil.Process(conn.pid).name()} (pid {conn.pid})"
                return "another program"
    return "another program"
