"""A household's use of lucebox on the LAN, run as one script: `lucebox serve` of SmolLM2 on
``HOST``; a second process finds it by mDNS (when ``--find FROM`` names the address it listens
from), chats through it with a person's key, is refused a path beyond its scope, sees its use
in `status`, loses access the moment the key is revoked; an allowed origin's preflight gets
the CORS headers and another origin's is refused. Prints what it saw as JSON.

The discovery test runs it inside a network namespace it makes (nothing reaches a real
network); where that cannot be made, it runs on loopback without the discovery step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

import httpx

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.machine import config
from lucebox.engine.machine.personkeys import add_key, revoke_key
from lucebox.engine.run import announce
from support.health import wait_healthy
from support.realmodels import smol_model

ALLOWED_ORIGIN = "http://10.77.0.2:3000"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lucebox.app.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def _status() -> dict[str, Any]:
    reply: dict[str, Any] = json.loads(_cli("status", "--json").stdout)
    return reply


def _use_of(name: str) -> dict[str, Any] | None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = [k for k in _status().get("keys", []) if k["name"] == name]
        if found:
            return dict(found[0])
        time.sleep(0.5)  # the state file is written once a second
    return None


def run(host: str, find_from: str | None) -> dict[str, Any]:
    paths = resolve_paths()
    config.set_setting(paths, "server.allowed_origins", ALLOWED_ORIGIN)
    config.set_setting(paths, "server.mdns_name", "lucebox")  # inside the test's namespace
    _, phone = add_key(paths, "phone", "chat")
    seen: dict[str, Any] = {}
    argv = ["serve", "--model", str(smol_model()), "--ctx", "2048", "--host", host]
    serve = subprocess.Popen(
        [sys.executable, "-m", "lucebox.app.cli", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://{host}:8080"
        assert wait_healthy(url, 600, serve), "lucebox serve did not get ready"
        if find_from is not None:
            found = announce.find((find_from,), wait_s=3.0)
            seen["found"] = [
                {"name": f.name, "url": f.url, "key_needed": f.key_needed} for f in found
            ]
            url = found[0].url if found else url
        auth = {"authorization": f"Bearer {phone}"}
        seen["chat"] = httpx.post(
            f"{url}/v1/chat/completions", json=CHAT, headers=auth, timeout=120
        ).status_code
        seen["slots"] = httpx.get(f"{url}/slots", headers=auth, timeout=30).status_code
        preflight = {"access-control-request-method": "POST"}
        allowed = httpx.options(
            f"{url}/v1/chat/completions", headers={**preflight, "origin": ALLOWED_ORIGIN}
        )
        other = httpx.options(
            f"{url}/v1/chat/completions", headers={**preflight, "origin": "http://10.77.0.9:3000"}
        )
        seen["preflight"] = [
            allowed.status_code,
            allowed.headers.get("access-control-allow-origin"),
            other.status_code,
        ]
        seen["use"] = _use_of("phone")
        pid_before = _status().get("engine_pid")
        seen["share"] = json.loads(_cli("share", "--json").stdout or "{}")
        revoke_key(paths, "phone")
        seen["after_revoke"] = httpx.post(
            f"{url}/v1/chat/completions", json=CHAT, headers=auth, timeout=60
        ).status_code
        seen["engine_kept"] = _status().get("engine_pid") == pid_before  # no restart for it
    finally:
        _cli("down")
        serve.wait(timeout=60)
    return seen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("host")
    parser.add_argument("--find", dest="find_from")
    args = parser.parse_args()
    print(json.dumps(run(args.host, args.find_from)))


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
