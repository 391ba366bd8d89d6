"""A network namespace for the LAN tests: two veth ends with multicast on (10.77.0.1 and
10.77.0.2), made by ``unshare -n`` so that nothing a test announces reaches a real network."""

from __future__ import annotations

import shutil
import subprocess

SERVER_ADDRESS = "10.77.0.1"
CLIENT_ADDRESS = "10.77.0.2"
SETUP = f"""
ip link set lo up
ip link add v0 type veth peer name v1
ip addr add {SERVER_ADDRESS}/24 dev v0 && ip addr add {CLIENT_ADDRESS}/24 dev v1
ip link set v0 up && ip link set v1 up
ip link set v0 multicast on && ip link set v1 multicast on
ip route add 224.0.0.0/4 dev v0
"""
"""The shell lines that lay the namespace out; a test's own lines follow them."""


def why_not() -> str | None:
    """Why no such namespace can be made here (None: it can)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip is missing"
    tried = subprocess.run(
        ["unshare", "-n", "sh", "-c", "ip link add v0 type veth peer name v1"],
        capture_output=True,
        text=True,
        check=False,
    )
    return None if tried.returncode == 0 else f"no network namespace here: {tried.stderr.strip()}"


def in_namespace(script: str) -> list[str]:
    """The command that runs ``script`` (bash) inside a new namespace laid out as above."""
    return ["unshare", "-n", "bash", "-c", SETUP + script]
