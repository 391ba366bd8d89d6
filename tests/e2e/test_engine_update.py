"""`lucebox engine update` and `rollback` with the real CPU engine: the one build registered a
second time (`engine add` of the same llama-server) stands in for a newer version, and a script
that only looks like llama-server for a build that fails its self-test."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from lucebox.engine.core.errors import EXIT_REFUSED
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.machine import config
from support.realmodels import smol_model
from support.smolserver import private_engine_home
from tests.conftest import assert_one_line_error, run_lucebox

pytestmark = pytest.mark.slow


def lucebox(home: Path, *args: str, timeout_s: float = 1200):
    return run_lucebox(*args, env={"LUCEBOX_HOME": str(home)}, timeout_s=timeout_s)


def engine_status(home: Path) -> dict:
    result = lucebox(home, "engine", "status", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def added_id(home: Path, server: Path) -> str:
    """``engine add`` of ``server``; engine.id keeps the build that serves now (an added build is
    the newest installed, which a launch with no engine.id would take)."""
    paths = resolve_paths({"LUCEBOX_HOME": str(home)})
    config.set_setting(paths, "engine.id", engine_status(home)["selected"])
    result = lucebox(home, "engine", "add", str(server))
    assert result.returncode == 0, result.stderr
    return result.stdout.split(":", 1)[0]


def update_to(home: Path, engine_id: str):
    model = str(smol_model())
    args = ("engine", "update", "--to", engine_id, "--model", model, "--ctx", "2048", "--json")
    return lucebox(home, *args)


def test_update_self_tests_then_activates_and_rollback_returns_in_seconds(
    built_engine_home, tmp_path
):
    home = private_engine_home(tmp_path / "home")
    current = engine_status(home)["selected"]
    server = Path(
        next(e for e in engine_status(home)["engines"] if e["id"] == current)["server_path"]
    )
    second = added_id(home, server)
    assert second != current

    result = update_to(home, second)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["passed"] and report["switched"] and report["failed_probe"] is None
    # The user's 2,048 tokens cannot hold the long probe: both builds serve the test's own.
    assert "self-testing at a 8192-token context" in result.stderr
    names = [p["name"] for p in report["probes"]]
    assert names == [
        "load",
        "chat",
        "streaming",
        "anthropic",
        "responses",
        "tool-call",
        "memory",
        "speed",
    ]
    assert report["speed"]["current"]["decode_tok_s"] > 0
    assert report["speed"]["candidate"]["prefill_tok_s"] > 0
    # The band is the spread of the current build's rounds in this run, held between its bounds.
    speed = report["speed"]
    assert speed["noise_floor"] <= speed["noise"] <= speed["noise_cap"]
    paths = resolve_paths({"LUCEBOX_HOME": str(home)})
    assert config.load_settings(paths).engine_id == second
    assert engine_status(home)["selected"] == second
    status = json.loads(lucebox(home, "status", "--json").stdout)
    assert status["engine_update"]["previous_id"] == current
    assert status["engine_update"]["current_id"] == second

    started_s = time.monotonic()
    back = lucebox(home, "engine", "rollback")
    assert back.returncode == 0, back.stderr
    assert time.monotonic() - started_s < 15  # one CLI start, no build
    assert f"from {second} to {current}" in back.stdout
    assert config.load_settings(paths).engine_id == current


def test_a_build_that_fails_its_self_test_is_never_activated(built_engine_home, tmp_path):
    home = private_engine_home(tmp_path / "home")
    current = engine_status(home)["selected"]
    server = next(e for e in engine_status(home)["engines"] if e["id"] == current)["server_path"]
    # Answers --version and --help as llama-server does (so `engine add` takes it), then dies
    # at every start: a broken copy.
    help_text = tmp_path / "help.txt"
    help_text.write_text(run_help(server))
    broken = tmp_path / "broken" / "llama-server"
    broken.parent.mkdir()
    broken.write_text(
        f"#!{sys.executable}\nimport sys\n"
        "if '--version' in sys.argv: print('version: 0.0.1-broken (build 1)'); sys.exit(0)\n"
        f"if '--help' in sys.argv: print(open({str(help_text)!r}).read()); sys.exit(0)\n"
        "print('error: this copy is broken', flush=True)\nsys.exit(1)\n"
    )
    broken.chmod(0o755)
    broken_id = added_id(home, broken)
    paths = resolve_paths({"LUCEBOX_HOME": str(home)})
    before = config.load_settings(paths).engine_id

    result = update_to(home, broken_id)
    assert result.returncode == EXIT_REFUSED, result.stderr
    assert_one_line_error(result)
    assert f"{broken_id} failed its self-test at the load probe" in result.stderr
    assert json.loads(result.stdout)["failed_probe"] == "load"
    assert config.load_settings(paths).engine_id == before
    assert engine_status(home)["selected"] == current
    assert lucebox(home, "engine", "rollback").returncode == 2  # nothing was switched


def run_help(server: str) -> str:
    import subprocess

    done = subprocess.run([server, "--help"], capture_output=True, text=True, check=False)
    return done.stdout + done.stderr
