"""The engine's built-in web UI: whether an engine has it, why a build went without, its URL.

llama-server embeds the UI's files when its build produced them (``tools/ui`` built with npm)
and serves them at ``/``, without an API key even when one is set: the page asks for the key
itself. Whether an engine has the UI is read from the binary, so it holds for built, fetched
and registered engines alike.
"""

from __future__ import annotations

import contextlib
import ipaddress
import mmap
import re
import socket
from collections.abc import Mapping
from pathlib import Path

ASSET_MARKER = b"_app/version.json"
"""An asset name that only a server with embedded UI files contains."""
_UI_LINE = re.compile(r"\bUI: (.*)$", re.M)
_NPM_ERROR = re.compile(r"^\W*(?:stderr: )?npm (?:error|ERR!) (?!code |syscall |errno )(.+)$", re.M)
_NPM_FAILURES = ("npm ci failed", "npm run build failed", "npm not found")
_PROBE_ADDRESS = ("192.0.2.1", 9)
"""TEST-NET-1: a UDP connect there picks the LAN interface without sending anything."""


def has_webui(server: Path) -> bool:
    """Whether the llama-server binary at ``server`` carries the web UI's files."""
    try:
        with (
            server.open("rb") as handle,
            mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data,
        ):
            return data.find(ASSET_MARKER) >= 0
    except (OSError, ValueError):
        return False


def why_no_webui(build_log: str) -> str:
    """Why a build with the UI asked for embedded none, from the ``UI:`` lines of its log."""
    lines = [match.group(1).strip() for match in _UI_LINE.finditer(build_log)]
    failure = next((line for line in reversed(lines) if line.startswith(_NPM_FAILURES)), None)
    if failure is None:
        return lines[-1] if lines else "the build log has no UI lines"
    npm_error = _NPM_ERROR.search(build_log)
    return f"{failure}: {npm_error.group(1).strip()}" if npm_error else failure


def lan_address() -> str | None:
    """This machine's address on its LAN (the interface of the default route), if any."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(_PROBE_ADDRESS)
        address = str(sock.getsockname()[0])
        if not ipaddress.ip_address(address).is_loopback and address != "0.0.0.0":
            return address
    return None


def webui_url(host: str, port: int) -> str:
    """Where a browser finds the UI of a server bound to ``host``:``port``.

    A wildcard bind is reachable from the LAN, so its URL names the LAN address a phone or
    another PC would use; loopback stays loopback.
    """
    if host in ("0.0.0.0", "::", ""):
        host = lan_address() or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/"


def served_url(server_path: str, host: str, port: int) -> str | None:
    """The UI's URL for a llama-server at ``server_path`` bound there; None if it has no UI."""
    return webui_url(host, port) if has_webui(Path(server_path)) else None


def has_desktop(environ: Mapping[str, str], platform: str) -> bool:
    """Whether a browser can open here: a graphical session, not a console or an SSH login."""
    if platform in ("darwin", "win32"):
        return True
    return bool(environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY"))
