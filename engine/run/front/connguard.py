"""What one client connection may hold of the front: how long it may stay silent, how long a
request may take to arrive, how long an answer may wait for the client to read it, and how
many connections one address may keep open at once.

A home server on the LAN meets buggy and hostile clients: one that opens hundreds of idle
connections, sends a byte a second, or never reads its answer would otherwise hold sockets,
memory and (for an answer never read) the engine's slot for as long as it likes.
"""

from __future__ import annotations

import ipaddress
from collections import Counter

IDLE_S = 120.0
"""Longest wait for a request's head on an open connection (the first, or the next on a kept
alive one): longer than any client waits between requests it means to send."""
BODY_S = 120.0
"""Longest a request's body may take to arrive once its head has: the largest body allowed
takes seconds on a home network."""
WRITE_STALL_S = 120.0
"""Longest an answer may wait for the client to read what was written: then it counts as gone
(its engine work stops), as a client that hung up does."""
MAX_CONNECTIONS_PER_ADDRESS = 64
"""Connections one address of the network may keep open at once: far more than a client's
connection pool. This PC's own programs (loopback) are not bounded: one that means harm here
needs no sockets for it, and lucebox's own clients and agents run there."""


class AddressCount:
    """Open connections by client address, for the per-address bound."""

    def __init__(self, limit: int = MAX_CONNECTIONS_PER_ADDRESS) -> None:
        self.limit = limit
        self._open: Counter[str] = Counter()

    def enter(self, address: str) -> bool:
        """Count a new connection from ``address``; False when it is one too many (it is
        not counted, and must be refused)."""
        if _loopback(address):
            return True
        if self._open[address] >= self.limit:
            return False
        self._open[address] += 1
        return True

    def leave(self, address: str) -> None:
        if _loopback(address):
            return
        self._open[address] -= 1
        if self._open[address] <= 0:
            del self._open[address]

    def refusal(self, address: str) -> str:
        return (
            f"more than {self.limit} connections from {address} are open at once: close some "
            "(a client's connection pool reuses a few)"
        )


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
