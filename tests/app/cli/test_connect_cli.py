"""`lucebox connect` and `launch` without a server: what each client gets, --write merging into
real files, --restore putting the user's original back, and the refusals."""

from __future__ import annotations

import json
import stat
import tomllib
from pathlib import Path

import pytest

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.machine.apikey import ensure_api_key_file
from lucebox.engine.machine.personkeys import keys_path, read_keys
from lucebox.engine.run.front.frontguard import Caller, FrontPolicy, admit
from lucebox.engine.run.lastserved import served_now, write_last_served
from tests.conftest import assert_one_line_error, run_lucebox

URL = "http://127.0.0.1:8123"
MODEL = "qwen3-4b-8gb"


def remember_server(lucebox_home: Path, *, ctx: int = 32768, keyed: bool = False) -> None:
    """The record a server leaves when it becomes ready (no server runs now)."""
    paths = resolve_paths({"LUCEBOX_HOME": str(lucebox_home)})
    key_file = None
    if keyed:
        key_file = str(ensure_api_key_file(paths, "lb-secret")[0])
    record = served_now(
        URL, (MODEL,), ctx, api_key_file=key_file, on_gpu=True, weights_bytes=2_500_000_000
    )
    write_last_served(paths, record)


@pytest.fixture
def home(tmp_path, lucebox_home):
    """A HOME of its own and a server that ran before (none is running)."""
    folder = tmp_path / "user-home"
    folder.mkdir()
    remember_server(lucebox_home)
    return folder, {"HOME": str(folder), "LUCEBOX_HOME": str(lucebox_home)}


def connect(env, *args):
    return run_lucebox("connect", *args, env=env)


def test_with_no_server_ever_it_refuses_and_says_what_to_do(tmp_path, lucebox_home):
    env = {"HOME": str(tmp_path), "LUCEBOX_HOME": str(lucebox_home)}
    assert run_lucebox("config", "set", "server.port", "8999", env=env).returncode == 0
    for command in ("connect", "launch"):
        result = run_lucebox(command, "codex", env=env)
        assert result.returncode == 2
        assert_one_line_error(result) if command == "connect" else None
        assert "lucebox up" in result.stderr or "not installed" in result.stderr
    assert not (tmp_path / ".codex").exists()


def test_server_down_uses_the_last_served_address_and_says_so(home):
    _, env = home
    result = connect(env, "codex", "--json")
    assert result.returncode == 0, result.stderr
    assert "no server is running" in result.stderr and URL in result.stderr
    report = json.loads(result.stdout)
    assert report["base_url"] == URL and report["model"] == MODEL and report["ctx"] == 32768


def test_unknown_client_gets_the_nearest_name(home):
    _, env = home
    for command in ("connect", "launch"):
        result = run_lucebox(command, "claude", env=env)
        assert result.returncode == 2
        assert_one_line_error(result)
        assert "did you mean `claude-code`?" in result.stderr


def test_claude_code_write_then_restore_puts_the_original_back(home):
    folder, env = home
    settings = folder / ".claude" / "settings.json"
    settings.parent.mkdir()
    original = json.dumps({"theme": "dark", "env": {"KEEP": "1", "ANTHROPIC_MODEL": "old"}})
    settings.write_text(original)
    result = connect(env, "claude-code", "--write", "--json")
    assert result.returncode == 0, result.stderr
    merged = json.loads(settings.read_text())
    assert merged["theme"] == "dark"
    assert merged["env"] == {
        "KEEP": "1",
        "ANTHROPIC_BASE_URL": URL,
        "ANTHROPIC_AUTH_TOKEN": "lucebox-no-key",
        "ANTHROPIC_MODEL": MODEL,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL,
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "2048",
    }
    assert Path(json.loads(result.stdout)["backups"][0]).read_text() == original
    settings.write_text(json.dumps({"theme": "light", "env": merged["env"]}))
    assert connect(env, "claude-code", "--write").returncode == 0
    restored = connect(env, "claude-code", "--restore")
    assert restored.returncode == 0, restored.stderr
    assert settings.read_text() == original  # the original, not the newest backup
    assert "last content is kept as" in restored.stdout
    again = connect(env, "claude-code", "--restore")
    assert "nothing to restore" in again.stdout


def test_restore_removes_files_that_did_not_exist(home):
    folder, env = home
    result = connect(env, "aider", "--write")
    assert result.returncode == 0, result.stderr
    assert "backup has them" not in result.stdout and "kept as" not in result.stdout
    conf = (folder / ".aider.conf.yml").read_text()
    assert 'openai-api-key: "lucebox-no-key"' in conf and f'model: "openai/{MODEL}"' in conf
    metadata = json.loads((folder / ".aider.model.metadata.json").read_text())
    assert metadata[f"openai/{MODEL}"]["max_input_tokens"] == 32768
    assert run_lucebox("launch", "aider", "--restore", env=env).returncode == 0
    assert not (folder / ".aider.conf.yml").exists()
    assert not (folder / ".aider.model.metadata.json").exists()


def test_codex_write_keeps_other_tables_and_says_when_comments_go(home):
    folder, env = home
    config = folder / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_text(
        '# mine\napproval_policy = "on-request"\n\n[model_providers.other]\nname = "x"\n'
    )
    result = connect(env, "codex", "--write")
    assert result.returncode == 0, result.stderr
    assert "without its comments; the backup has them" in result.stdout
    merged = tomllib.loads(config.read_text())
    assert merged["approval_policy"] == "on-request"
    assert merged["model"] == MODEL and merged["model_provider"] == "lucebox"
    assert merged["model_context_window"] == 32768
    assert merged["model_providers"]["other"] == {"name": "x"}
    provider = merged["model_providers"]["lucebox"]
    assert provider["base_url"] == f"{URL}/v1" and provider["wire_api"] == "responses"
    assert "env_key" not in provider and "experimental_bearer_token" not in provider


def test_a_keyed_server_gets_its_key_from_the_key_file(tmp_path, lucebox_home):
    folder = tmp_path / "user-home"
    folder.mkdir()
    remember_server(lucebox_home, keyed=True)
    env = {"HOME": str(folder), "LUCEBOX_HOME": str(lucebox_home)}
    key_file = resolve_paths(env).config_dir / "api_key"
    printed = connect(env, "openai")
    assert f'export OPENAI_API_KEY="$(cat {key_file})"' in printed.stdout
    assert "lb-secret" not in printed.stdout
    assert connect(env, "opencode", "--write").returncode == 0
    opencode = json.loads((folder / ".config" / "opencode" / "opencode.json").read_text())
    assert opencode["provider"]["lucebox"]["options"]["apiKey"] == f"{{file:{key_file}}}"
    printed_codex = connect(env, "codex")
    assert f'experimental_bearer_token = "<the key in {key_file}>"' in printed_codex.stdout
    assert "lb-secret" not in printed_codex.stdout
    assert connect(env, "codex", "--write").returncode == 0
    codex = tomllib.loads((folder / ".codex" / "config.toml").read_text())
    assert codex["model_providers"]["lucebox"]["experimental_bearer_token"] == "lb-secret"


def test_llm_block_is_replaced_not_repeated_and_restored(home, tmp_path):
    folder, env = home
    llm_dir = folder / ".config" / "io.datasette.llm"
    llm_dir.mkdir(parents=True)
    models = llm_dir / "extra-openai-models.yaml"
    mine = "- model_id: other\n  model_name: other\n  api_base: http://example.invalid/v1\n"
    models.write_text(mine)
    for _ in range(2):
        assert connect(env, "llm", "--write").returncode == 0
    text = models.read_text()
    assert text.startswith(mine) and text.count("model_id:") == 2
    assert f'- model_id: "{MODEL}"' in text
    assert connect(env, "llm", "--restore").returncode == 0
    assert models.read_text() == mine


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
def test_sdks_get_a_placeholder_key_and_no_file(home, client):
    _, env = home
    printed = connect(env, client)
    assert printed.returncode == 0
    if client == "openai":
        assert f"export OPENAI_BASE_URL={URL}/v1" in printed.stdout
        assert "export OPENAI_API_KEY=lucebox-no-key" in printed.stdout
    else:
        assert f"export ANTHROPIC_BASE_URL={URL}" in printed.stdout
        assert "export ANTHROPIC_API_KEY=lucebox-no-key" in printed.stdout
    for command in (("connect", client, "--write"), ("launch", client)):
        refused = run_lucebox(*command, env=env)
        assert refused.returncode == 2
        assert_one_line_error(refused)


def test_launch_names_the_install_command_of_a_missing_client(home, tmp_path):
    _, env = home
    result = run_lucebox("launch", "opencode", env={**env, "PATH": str(tmp_path / "empty")})
    assert result.returncode == 2
    assert_one_line_error(result)
    assert "npm install -g opencode-ai" in result.stderr


def test_a_cpu_server_warns_of_a_slow_or_too_long_agent_prompt(tmp_path, lucebox_home):
    paths = resolve_paths({"LUCEBOX_HOME": str(lucebox_home)})
    env = {"HOME": str(tmp_path), "LUCEBOX_HOME": str(lucebox_home)}
    record = served_now(
        URL, ("smol",), 3072, api_key_file=None, on_gpu=False, weights_bytes=98_000_000
    )
    write_last_served(paths, record)
    short = connect(env, "codex")
    assert "more than the served context of 3072 tokens" in short.stderr
    assert "--ctx 4096" in short.stderr
    write_last_served(
        paths,
        served_now(
            URL, ("smol",), 16384, api_key_file=None, on_gpu=False, weights_bytes=98_000_000
        ),
    )
    slow = connect(env, "codex")
    assert "its first request takes" in slow.stderr and "prompt cache" in slow.stderr
    assert connect(env, "openai").stderr.count("prompt") == 0


def test_a_served_set_names_every_alias_and_the_model_chosen(home):
    import os

    from lucebox.engine.core.paths import resolve_paths
    from lucebox.engine.run import runstate
    from lucebox.engine.run.servedsetmodels import ModelStatus

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


def test_a_person_key_is_written_in_place_of_the_servers(tmp_path, lucebox_home):
    folder = tmp_path / "user-home"
    folder.mkdir()
    remember_server(lucebox_home, keyed=True)
    env = {"HOME": str(folder), "LUCEBOX_HOME": str(lucebox_home)}
    paths = resolve_paths(env)
    made = run_lucebox("keys", "add", "phone", env=env)
    phone = made.stdout.strip()
    assert made.returncode == 0 and phone.startswith("lbk-")
    assert connect(env, "codex", "--key", phone, "--write").returncode == 0
    codex = tomllib.loads((folder / ".codex" / "config.toml").read_text())
    assert codex["model_providers"]["lucebox"]["experimental_bearer_token"] == phone
    kept = paths.config_dir / "client-keys" / "phone.key"
    printed = connect(env, "openai", "--key", phone)
    assert f'export OPENAI_API_KEY="$(cat {kept})"' in printed.stdout
    assert phone not in printed.stdout and "the key of 'phone'" in printed.stderr
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600

    # A new name: a chat key is made for it, and the front admits what was written.
    tablet = connect(env, "openai", "--key", "tablet")
    assert tablet.returncode == 0 and "made now" in tablet.stderr
    written = (paths.config_dir / "client-keys" / "tablet.key").read_text().strip()
    policy = FrontPolicy("0.0.0.0", 8123, "lb-secret", people=lambda: read_keys(keys_path(paths)))
    headers = {"host": "192.168.1.5:8123", "authorization": f"Bearer {written}"}
    assert admit(policy, "POST", "/v1/chat/completions", headers) == Caller("tablet", "chat")

    hashed = connect(env, "openai", "--key", "phone")
    assert hashed.returncode == 2 and "kept hashed" in hashed.stderr
    assert_one_line_error(hashed)
    unknown = connect(env, "openai", "--key", "lbk-not-one-of-ours")
    assert unknown.returncode == 2 and "not a key of this server" in unknown.stderr
