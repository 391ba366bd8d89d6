"""The one wait for a server's ``/health``: until it answers 200, the process it belongs to
exits, or the time is up."""

from __future__ import annotations

import subprocess
import time

import httpx


def wait_healthy(
    url: str,
    timeout_s: float,
    process: subprocess.Popen[bytes] | subprocess.Popen[str] | None = None,
    *,
    interval_s: float = 0.1,
) -> bool:
    """Whether ``url``'s ``/health`` answered 200 within ``timeout_s`` (False as soon as
    ``process``, the server's own, has exited)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            return False
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(interval_s)
    return False
