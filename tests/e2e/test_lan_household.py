"""A household on the LAN, as tried by a new user: `lucebox serve` of SmolLM2 on the CPU's real
llama-server; a second process finds it by mDNS and chats with a person's key; a path beyond
the key's scope is refused; `status` counts the key's use; the key revoked is refused at its
next request with no restart; an allowed origin's preflight is answered and another's refused.
Discovery runs inside a network namespace the test makes; where none can be made the rest runs
on loopback, and the test says discovery was left out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support import netns
from support.lanscenario import ALLOWED_ORIGIN
from support.smolserver import private_engine_home

ROOT = Path(__file__).parents[2]


def test_a_household_finds_lucebox_and_each_key_counts(built_engine_home, tmp_path, capsys):
    home = private_engine_home(tmp_path / "home")
    env = {**os.environ, "LUCEBOX_HOME": str(home)}
    why = netns.why_not()
    scenario = [sys.executable, "-m", "support.lanscenario"]
    if why is None:
        found_from = f" --find {netns.CLIENT_ADDRESS}"
        command = netns.in_namespace(" ".join([*scenario, netns.SERVER_ADDRESS]) + found_from)
    else:
        with capsys.disabled():
            print(f"\ndiscovery left out ({why}): the keys and origins run on loopback")
        command = [*scenario, "127.0.0.1"]
    done = subprocess.run(
        command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    if why is None:
        assert seen["found"] == [
            {"name": "lucebox", "url": f"http://{netns.SERVER_ADDRESS}:8080", "key_needed": True}
        ]
        assert "http://lucebox.local:8080/" in seen["share"]["chat_urls"]
    assert seen["chat"] == 200
    assert seen["slots"] == 403  # a chat key reaches no engine internals
    assert seen["preflight"] == [204, ALLOWED_ORIGIN, 403]
    assert seen["use"]["requests"] >= 1 and seen["use"]["tokens"] >= 1
    assert seen["after_revoke"] == 401 and seen["engine_kept"]
