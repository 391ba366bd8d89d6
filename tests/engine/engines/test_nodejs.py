"""node and npm for the web UI build: the system's when new enough, else lucebox's from PyPI."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.engines import nodejs
from lucebox.engine.engines.toolchain import version_tuple
from support.uibuild import old_node_only, pip_cannot_reach_an_index


def test_the_systems_node_is_used_when_new_enough():
    system = shutil.which("node")
    if system is None:
        pytest.skip("no node on PATH")
    found = nodejs.probe_node(resolve_paths())
    if version_tuple(found.node.version)[:2] < nodejs.NODE_MIN_VERSION:
        pytest.skip(f"the system's node {found.node.version} is too old for this test")
    assert found.usable and found.origin == "system"
    assert found.node.path == system and found.path_dirs == ()
    assert found.build_env({"PATH": "/usr/bin"}) == {"PATH": "/usr/bin"}


def test_an_old_node_is_not_used_and_says_why(tmp_path, monkeypatch):
    old_node_only(tmp_path, monkeypatch)
    found = nodejs.probe_node(resolve_paths())
    assert not found.usable
    assert found.reason == "the system's node 18.19.1 is older than 20.19"


def test_no_node_and_no_index_is_a_reason_not_an_error(tmp_path, monkeypatch):
    old_node_only(tmp_path, monkeypatch)
    pip_cannot_reach_an_index(monkeypatch)
    paths = resolve_paths()
    found = nodejs.ensure_node(paths)
    assert not found.usable and found.origin == "none"
    assert found.reason.startswith("the system's node 18.19.1 is older than 20.19; ")
    assert f"installing {nodejs.NODE_WHEEL} with pip failed" in found.reason
    assert not nodejs.wheel_dir(paths).exists()
    assert not any(nodejs.wheel_dir(paths).parent.iterdir())  # no half-installed staging


@pytest.mark.slow
def test_an_old_node_gets_lucebox_its_own_node_from_pypi(tmp_path, monkeypatch):
    old_node_only(tmp_path, monkeypatch)
    paths = resolve_paths()
    found = nodejs.ensure_node(paths)
    assert found.usable and found.origin == "lucebox", found.reason
    assert version_tuple(found.node.version)[:2] >= nodejs.NODE_MIN_VERSION
    assert Path(found.node.path or "").is_relative_to(nodejs.wheel_dir(paths))
    env = found.build_env()
    # What the UI build runs: npm found on PATH, and scripts that start `#!/usr/bin/env node`.
    npm = subprocess.run(["npm", "--version"], env=env, capture_output=True, text=True, timeout=60)
    assert npm.returncode == 0 and npm.stdout.strip() == found.npm.version, npm.stderr
    node = subprocess.run(
        ["/usr/bin/env", "node", "-e", "console.log(process.version)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert node.stdout.strip() == f"v{found.node.version}"
    assert nodejs.probe_node(paths) == found  # installed once, found again without pip
