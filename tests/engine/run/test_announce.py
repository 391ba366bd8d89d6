"""lucebox on the LAN by name: the records it announces, and, inside a network namespace the
test makes (two veth ends, multicast on, nothing reaches a real network), a second process
finding it over mDNS."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from lucebox.engine.run.announce import API_SERVICE, PAGE_SERVICE, Announced, _infos, lan_addresses
from lucebox.engine.run.sample import LanStatus
from support import netns

SERVED = Announced("lucebox", ("10.77.0.1",), 8080, "smollm2", "llama-server", key_needed=True)


def test_the_records_name_the_page_and_the_api_and_never_the_key():
    api, page = _infos(SERVED)
    assert (api.type, api.name, api.port) == (API_SERVICE, f"lucebox.{API_SERVICE}", 8080)
    assert api.server == "lucebox.local." and api.parsed_addresses() == ["10.77.0.1"]
    assert api.properties == {
        b"path": b"/v1",
        b"model": b"smollm2",
        b"engine": b"llama-server",
        b"key": b"required",
    }
    assert (page.type, page.properties) == (PAGE_SERVICE, {b"path": b"/"})


def test_loopback_and_link_local_are_never_announced():
    assert lan_addresses("127.0.0.1") == ()
    assert lan_addresses("169.254.3.4") == ()
    assert lan_addresses("192.168.1.5") == ("192.168.1.5",)
    assert all(not a.startswith("127.") for a in lan_addresses("0.0.0.0"))
    shown = LanStatus("lucebox", ("192.168.1.5",), 8080)
    assert shown.chat_urls() == ("http://lucebox.local:8080/", "http://192.168.1.5:8080/")
    assert LanStatus.from_json(json.loads(json.dumps(shown.to_json()))) == shown


ANNOUNCE = """
import time
from lucebox.engine.run.announce import Announced, announcing
with announcing(Announced("lucebox", ("10.77.0.1",), 8080, "smollm2", "llama-server", True)):
    time.sleep(6)
"""
FIND = """
import dataclasses, json
from lucebox.engine.run.announce import find
print(json.dumps([dataclasses.asdict(f) for f in find(("10.77.0.2",), wait_s=2.0)]))
"""


def test_a_second_process_finds_lucebox_by_name():
    why = netns.why_not()
    if why is not None:
        pytest.skip(f"the two-process discovery test needs a network namespace: {why}")
    script = textwrap.dedent(f"""
        {sys.executable} -c '{ANNOUNCE}' & sleep 1.5
        {sys.executable} -c '{FIND}'
        wait
    """)
    done = subprocess.run(
        netns.in_namespace(script),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (found,) = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {
        "name": "lucebox",
        "address": "10.77.0.1",
        "port": 8080,
        "model": "smollm2",
        "engine": "llama-server",
        "key_needed": True,
    }
