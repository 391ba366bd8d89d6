"""Free loopback ports for servers started by tests and benchmarks."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_pair() -> int:
    """A port whose next one is free too (a server that also listens one port up, as the RPC
    worker's info port does)."""
    for _ in range(50):
        port = free_port()
        if port < 65535:
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    raise RuntimeError("no two adjacent free loopback ports")
