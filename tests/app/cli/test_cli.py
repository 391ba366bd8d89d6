from __future__ import annotations

import json

import pytest

from lucebox.app.cli.parser import build_parser
from tests.conftest import assert_one_line_error, run_lucebox

DESIGN_COMMANDS = [
    ["up"],
    ["serve"],
    ["status"],
    ["down"],
    ["logs"],
    ["doctor"],
    ["presets"],
    ["plan"],
    ["models", "check"],
    ["models", "pull"],
    ["models", "list"],
    ["models", "rm"],
    ["models", "verify"],
    ["models", "update"],
    ["models", "rollback"],
    ["models", "prune"],
    ["engine", "source"],
    ["engine", "build"],
    ["engine", "status"],
    ["engine", "path"],
    ["bench", "replay"],
    ["bench", "quick"],
    ["connect"],
    ["config", "show"],
]


def test_help_lists_every_command():
    result = run_lucebox("--help")
    assert result.returncode == 0
    for name in [
        "up",
        "serve",
        "status",
        "down",
        "logs",
        "doctor",
        "presets",
        "plan",
        "models",
        "engine",
        "bench",
        "connect",
        "config",
    ]:
        assert f"    {name} " in result.stdout


@pytest.mark.parametrize("command", DESIGN_COMMANDS, ids=" ".join)
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args([*command, "--help"])
    assert done.value.code == 0
    assert "usage: lucebox" in capsys.readouterr().out


def test_doctor_json_without_gpu_is_clean():
    result = run_lucebox("doctor", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["gpus"] == []
    assert "no NVIDIA GPU" in report["gpu_detail"]
    names = {c["name"] for c in report["checks"]}
    assert {
        "gpu",
        "cmake",
        "c-compiler",
        "cxx-compiler",
        "disk",
        "ram",
        "engine",
        "models",
    } <= names
    for check in report["checks"]:
        assert check["verdict"] in {"ok", "warn", "missing"}
        if check["verdict"] != "ok":
            assert check["action"], check


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--ctx", "-5"],
        ["up", "--port", "70000"],
        ["serve", "--ctx", "lots"],
        ["config", "set", "colour", "blue"],
        ["nonsense"],
    ],
)
def test_usage_errors_exit_2_without_traceback(argv):
    result = run_lucebox(*argv)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "error:" in result.stderr


def test_corrupt_config_is_one_line_exit_2_and_untouched(lucebox_home):
    config_file = lucebox_home / "config" / "config.toml"
    config_file.parent.mkdir(parents=True)
    config_file.write_text("[server\nport = 1")
    for argv in (["config", "show"], ["config", "set", "server.port", "9000"]):
        result = run_lucebox(*argv)
        assert result.returncode == 2
        assert_one_line_error(result)
        assert str(config_file) in result.stderr
        assert "lucebox config reset" in result.stderr
    assert config_file.read_text() == "[server\nport = 1"


def test_config_reset_keeps_the_corrupt_file(lucebox_home):
    config_file = lucebox_home / "config" / "config.toml"
    config_file.parent.mkdir(parents=True)
    config_file.write_text("[server\nport = 1")
    result = run_lucebox("config", "reset")
    assert result.returncode == 0
    (kept,) = config_file.parent.glob("config.toml.bad-*")
    assert kept.read_text() == "[server\nport = 1"
    assert str(kept) in result.stderr


def test_unwritable_config_dir_is_one_line(lucebox_home):
    lucebox_home.mkdir()
    (lucebox_home / "config").write_text("I am a file")
    result = run_lucebox("config", "set", "server.port", "9000")
    assert result.returncode == 2
    assert_one_line_error(result)
    assert (lucebox_home / "config").read_text() == "I am a file"


def test_lucebox_home_is_a_file(tmp_path):
    target = tmp_path / "home-file"
    target.write_text("precious")
    result = run_lucebox("doctor", env={"LUCEBOX_HOME": str(target)})
    assert result.returncode == 2
    assert_one_line_error(result)
    assert "LUCEBOX_HOME" in result.stderr
    assert target.read_text() == "precious"


def test_config_set_show_round_trip():
    assert run_lucebox("config", "set", "server.port", "8099").returncode == 0
    shown = json.loads(run_lucebox("config", "show", "--json").stdout)
    assert shown["settings"]["server.port"] == 8099


def test_up_without_a_terminal_runs_headless_and_refuses_a_missing_model(tmp_path):
    missing = tmp_path / "no-such-model.gguf"
    result = run_lucebox("up", "--model", str(missing))
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "running headless" in lines[0]
    assert lines[-1].startswith("lucebox: ") and "does not exist" in lines[-1]
    assert "Traceback" not in result.stderr
