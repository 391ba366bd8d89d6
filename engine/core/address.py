"""Network addresses: which hosts stay on this machine."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
