"""`lucebox connect`: what each client gets, and --write merging into real files with a backup."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from tests.conftest import assert_one_line_error, run_lucebox


@pytest.fixture
def home(tmp_path, lucebox_home):
    """A HOME of its own and a configured preset + API key (no server is running)."""
    folder = tmp_path / "user-home"
    folder.mkdir()
    env = {"HOME": str(folder), "LUCEBOX_HOME": str(lucebox_home)}
    for key, value in (("preset", "qwen3-4b-8gb"), ("server.port", "8123")):
        assert run_lucebox("config", "set", key, value, env=env).returncode == 0
    return folder, env


def connect(env, *args):
    return run_lucebox("connect", *args, env=env)


def test_without_a_server_or_preset_it_says_what_to_do(tmp_path, lucebox_home):
    result = connect({"HOME": str(tmp_path), "LUCEBOX_HOME": str(lucebox_home)}, "codex")
    assert result.returncode == 2
    assert_one_line_error(result)
    assert "lucebox serve" in result.stderr


def test_claude_code_write_merges_env_and_keeps_a_backup(home):
    folder, env = home
    settings = folder / ".claude" / "settings.json"
    settings.parent.mkdir()
    original = json.dumps({"theme": "dark", "env": {"KEEP": "1", "ANTHROPIC_MODEL": "old"}})
    settings.write_text(original)
    assert run_lucebox("config", "set", "server.api_key", "lb-secret", env=env).returncode == 0
    result = connect(env, "claude-code", "--write", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    merged = json.loads(settings.read_text())
    assert merged["theme"] == "dark"
    assert merged["env"] == {
        "KEEP": "1",
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:8123",
        "ANTHROPIC_MODEL": "qwen3-4b-8gb",
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "ANTHROPIC_AUTH_TOKEN": "lb-secret",
    }
    assert report["written"] and Path(report["backup"]).read_text() == original
    again = connect(env, "claude-code", "--write", "--json")
    second_backup = json.loads(again.stdout)["backup"]
    assert second_backup != report["backup"]
    assert Path(report["backup"]).read_text() == original


def test_codex_write_keeps_other_tables(home):
    folder, env = home
    config = folder / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_text('approval_policy = "on-request"\n\n[model_providers.other]\nname = "x"\n')
    result = connect(env, "codex", "--write")
    assert result.returncode == 0, result.stderr
    merged = tomllib.loads(config.read_text())
    assert merged["approval_policy"] == "on-request"
    assert merged["model"] == "qwen3-4b-8gb" and merged["model_provider"] == "lucebox"
    assert merged["model_providers"]["other"] == {"name": "x"}
    assert merged["model_providers"]["lucebox"]["base_url"] == "http://127.0.0.1:8123/v1"
    assert merged["model_providers"]["lucebox"]["wire_api"] == "responses"
    assert "env_key" not in merged["model_providers"]["lucebox"]


def test_opencode_and_aider_print_then_write(home):
    folder, env = home
    printed = connect(env, "opencode")
    assert printed.returncode == 0
    snippet = printed.stdout.split("keeping a backup):\n", 1)[1]
    document = json.loads(snippet[: snippet.rindex("}") + 1])
    assert document["model"] == "lucebox/qwen3-4b-8gb"
    assert document["provider"]["lucebox"]["options"] == {"baseURL": "http://127.0.0.1:8123/v1"}
    assert not (folder / ".config").exists()

    aider = folder / ".aider.conf.yml"
    aider.write_text("dark-mode: true\nmodel: gpt-4o  # old\n")
    assert connect(env, "aider", "--write").returncode == 0
    assert aider.read_text() == (
        "dark-mode: true\n"
        'openai-api-base: "http://127.0.0.1:8123/v1"\n'
        'model: "openai/qwen3-4b-8gb"\n'
    )


def test_a_broken_config_file_is_refused_and_left_alone(home):
    folder, env = home
    settings = folder / ".config" / "opencode" / "opencode.json"
    settings.parent.mkdir(parents=True)
    settings.write_text("{broken")
    result = connect(env, "opencode", "--write")
    assert result.returncode == 2
    assert_one_line_error(result)
    assert "not valid JSON" in result.stderr
    assert settings.read_text() == "{broken"
    assert [p.name for p in settings.parent.iterdir()] == ["opencode.json"]


@pytest.mark.parametrize("client", ["openai", "anthropic"])
def test_sdks_get_environment_variables_and_no_file(home, client):
    _, env = home
    printed = connect(env, client)
    assert printed.returncode == 0
    variable = (
        "OPENAI_BASE_URL=http://127.0.0.1:8123/v1"
        if client == "openai"
        else ("ANTHROPIC_BASE_URL=http://127.0.0.1:8123")
    )
    assert f"export {variable}" in printed.stdout
    written = connect(env, client, "--write")
    assert written.returncode == 2
    assert_one_line_error(written)


def test_a_served_set_names_every_alias_and_the_model_chosen(home):
    import os

    from lucebox.engine.core.paths import resolve_paths
    from lucebox.engine.run import runstate
    from lucebox.engine.run.servedmodels import ModelStatus

    folder, env = home
    models = tuple(ModelStatus(alias, "unloaded", "CPU", 0, None) for alias in ("smollm2", "smoke"))
    paths = resolve_paths({"LUCEBOX_HOME": env["LUCEBOX_HOME"]})
    runstate.write_status(
        paths,
        runstate.Status(
            "ready", pid=os.getpid(), url="http://127.0.0.1:8123", model="smollm2, smoke",
            models=models,
        ),
    )  # fmt: skip
    first = connect(env, "opencode", "--write", "--json")
    assert first.returncode == 0, first.stderr
    written = json.loads((folder / ".config" / "opencode" / "opencode.json").read_text())
    assert set(written["provider"]["lucebox"]["models"]) == {"smollm2", "smoke"}
    assert written["model"] == "lucebox/smollm2"
    chosen = json.loads(connect(env, "codex", "--model", "smoke", "--json").stdout)
    assert chosen["model"] == "smoke"
    unknown = connect(env, "codex", "--model", "gpt-4")
    assert unknown.returncode == 2 and "served models: smollm2, smoke" in unknown.stderr
    assert_one_line_error(unknown)
