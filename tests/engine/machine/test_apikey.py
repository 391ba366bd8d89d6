"""The API key file: private, stable, and the only way the key reaches the engine."""

from __future__ import annotations

import dataclasses
import json
import stat
import subprocess
from pathlib import Path

import httpx
import pytest

from lucebox.engine.core.errors import ConfigError
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.engines.registry import select_engine
from lucebox.engine.machine import config
from lucebox.engine.machine.apikey import api_key_path, ensure_api_key_file, read_api_key
from lucebox.engine.machine.budget import budget_for
from lucebox.engine.machine.config import Settings
from lucebox.engine.machine.gpu import probe_gpus
from lucebox.engine.plan.launch import engine_url, server_argv
from lucebox.engine.plan.options import ServeOptions, resolve
from lucebox.engine.plan.planner import installs_of, plan_launch
from support.health import wait_healthy
from support.ports import free_port
from tests.conftest import run_lucebox


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_key_is_generated_once_into_a_private_file():
    paths = resolve_paths()
    path, key, created = ensure_api_key_file(paths)
    assert created and path == api_key_path(paths) and path.parent == paths.config_dir
    assert mode_of(path) == 0o600
    assert path.read_text() == f"{key}\n" and len(key) > 30
    again_path, again_key, again_created = ensure_api_key_file(paths)
    assert (again_path, again_key, again_created) == (path, key, False)


def test_a_key_the_user_set_replaces_the_file_and_loose_modes_are_tightened():
    paths = resolve_paths()
    path, _, _ = ensure_api_key_file(paths)
    path.chmod(0o644)
    _, key, created = ensure_api_key_file(paths, "my-own-key")
    assert (key, created) == ("my-own-key", False)
    assert read_api_key(path) == "my-own-key" and mode_of(path) == 0o600
    path.write_text("# comment\n\nhand-written\n")
    path.chmod(0o640)
    assert ensure_api_key_file(paths)[1:] == ("hand-written", False)
    assert mode_of(path) == 0o600


def test_an_unreadable_key_file_is_a_clear_error():
    paths = resolve_paths()
    path = api_key_path(paths)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\xff\xfe not text")
    with pytest.raises(ConfigError, match="cannot read the API key file"):
        ensure_api_key_file(paths)


def test_config_holding_a_key_is_private():
    paths = resolve_paths()
    config.set_setting(paths, "server.api_key", "lb-secret")
    assert mode_of(paths.config_file) == 0o600


def _proc_texts(name: str) -> dict[int, bytes]:
    texts = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                texts[int(entry.name)] = (entry / name).read_bytes()
            except OSError:
                continue
    return texts


@pytest.mark.slow
def test_the_real_engine_gets_the_key_from_the_file_only(built_engine_home, tmp_path):
    """llama-server behind a front bound beyond loopback asks for the key on its own private
    loopback port too; no command line shows it."""
    from support.realmodels import smol_model

    engine_paths = resolve_paths({"LUCEBOX_HOME": str(built_engine_home)})
    engine = select_engine(engine_paths, probe_gpus()).engine
    assert engine is not None
    paths = resolve_paths()
    key_file, key, _ = ensure_api_key_file(paths)
    port = free_port()
    options = ServeOptions(model=str(smol_model()), ctx=2048, host="0.0.0.0", port=port)
    launch = plan_launch(
        paths,
        options,
        resolved=resolve(options, Settings()),
        budget=budget_for(probe_gpus()),
        installs=installs_of(engine),
    )
    spec = dataclasses.replace(launch.server, api_key_file=str(key_file))
    paths.ensure(paths.slots_dir)  # prepare() makes it before a launch; the engine needs it
    log = (tmp_path / "engine.log").open("wb")
    proc = subprocess.Popen(server_argv(spec), stdout=log, stderr=subprocess.STDOUT)
    try:
        url = engine_url(spec)
        assert url == f"http://127.0.0.1:{spec.engine_port}"
        wait_healthy(url, 120, proc)
        assert proc.poll() is None, (tmp_path / "engine.log").read_text()
        cmdlines = _proc_texts("cmdline")
        assert b"--api-key-file" in cmdlines[proc.pid]
        assert not [pid for pid, text in cmdlines.items() if key.encode() in text]
        assert key.encode() not in _proc_texts("environ").get(proc.pid, b"")
        assert httpx.get(f"{url}/v1/models", timeout=10).status_code == 401
        wrong = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer nope"}, timeout=10)
        assert wrong.status_code == 401
        right = httpx.get(
            f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10
        )
        assert right.status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_plan_beyond_loopback_names_the_key_file_and_writes_nothing():
    paths = resolve_paths()
    config.set_setting(paths, "server.host", "0.0.0.0")
    done = run_lucebox("plan", "--json", "--preset", "smollm2", "--ctx", "2048")
    assert done.returncode == 0, done.stderr
    argv = json.loads(done.stdout)["argv"]
    assert argv[argv.index("--api-key-file") + 1] == str(api_key_path(paths))
    assert not api_key_path(paths).exists()


@pytest.mark.slow
def test_first_start_beyond_loopback_shows_the_key_once(built_engine_home):
    from support.realmodels import smol_model

    smol_model()  # warms pip's cache for the store's own pull
    engine = select_engine(resolve_paths({"LUCEBOX_HOME": str(built_engine_home)}), probe_gpus())
    assert engine.engine is not None
    assert run_lucebox("engine", "add", engine.engine.server_path).returncode == 0
    args = ("serve", "--prepare-only", "--preset", "smollm2", "--ctx", "2048", "--host", "0.0.0.0")
    first = run_lucebox(*args)
    assert first.returncode == 0, first.stderr
    key_file = api_key_path(resolve_paths())
    key = read_api_key(key_file)
    assert key and f"API key (shown once, kept in {key_file}): {key}" in first.stdout
    assert mode_of(key_file) == 0o600
    second = run_lucebox(*args)
    assert second.returncode == 0 and key not in second.stdout + second.stderr
    assert read_api_key(key_file) == key
