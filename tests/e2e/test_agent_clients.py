"""The real coding agents, first try: `connect --write` or `launch`, then one prompt.

Each client (installed from npm / PyPI by support/agentinstall.py) runs its non-interactive mode
in a HOME of its own against `lucebox serve` of SmolLM2 on the CPU engine, with no variable
set by hand: its request must show in the engine log and its reply come back, unless connect
or launch warned first that the client's own prompt does not fit the served context.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lucebox.engine.bench.compare import ServeConfig, Served, serving
from lucebox.engine.core.paths import Paths, resolve_paths
from lucebox.engine.pipeline import ServeOptions
from lucebox.engine.run.runstate import engine_log
from support.agentinstall import ClientsUnavailableError, client_bin_dirs
from support.ports import free_port
from support.realmodels import smol_model
from support.smolserver import private_engine_home

pytestmark = pytest.mark.slow

PROMPT = "Reply with one word: hello"
CTX = 6144
"""Codex's and Claude Code's own prompts (~3.3K, ~4.1K tokens) and their replies fit; Qwen
Code's (~7.6K) does not, which connect and launch must say."""
CLIENT_TIMEOUT_S = 600
TOO_LONG = "more than the served context"


def client_argv(client: str, model: str) -> list[str]:
    """The client's non-interactive run of one prompt (its command first)."""
    return {
        "codex": ["codex", "exec", "--skip-git-repo-check", PROMPT],
        "opencode": ["opencode", "run", PROMPT],
        "claude-code": ["claude", "-p", PROMPT],
        "aider": ["aider", "--message", PROMPT, "--no-git", "--yes-always", "--no-check-update"],
        "llm": ["llm", "-m", model, PROMPT],
        "qwen-code": ["qwen", "-p", PROMPT],
        "continue": ["cn", "-p", PROMPT],
    }[client]


@pytest.fixture(scope="module")
def clients_path() -> str:
    try:
        dirs = client_bin_dirs()
    except ClientsUnavailableError as exc:
        pytest.skip(f"the real clients are not installable here: {exc}")
    return os.pathsep.join([*map(str, dirs), os.environ.get("PATH", "")])


@pytest.fixture(scope="module")
def agent_server(built_engine_home, tmp_path_factory) -> Iterator[tuple[Paths, Served]]:
    home = private_engine_home(tmp_path_factory.mktemp("agents-home"))
    paths = resolve_paths({"LUCEBOX_HOME": str(home)})
    options = ServeOptions(model=str(smol_model()), ctx=CTX)
    env = {**os.environ, "LUCEBOX_HOME": str(home)}
    with serving(paths, options, ServeConfig("agents"), env=env, ready_timeout_s=600) as served:
        yield paths, served


def clean_env(home: Path, lucebox_home: Path, path: str) -> dict[str, str]:
    """This process's environment without anything that points a client somewhere."""
    kept = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("OPENAI_", "ANTHROPIC_", "CLAUDE_", "CODEX_", "XDG_", "LLM_"))
        and not name.startswith(("OPENCODE", "AIDER_", "QWEN_"))
    }
    return {**kept, "HOME": str(home), "LUCEBOX_HOME": str(lucebox_home), "PATH": path}


def prompts_served(paths: Paths) -> int:
    """The clients' prompts the engine read: every prompt its log times, less lucebox's own
    warm-up of each start (the supervisor logs each one answered)."""
    try:
        text = engine_log(paths).read_text("utf-8", "replace")
    except FileNotFoundError:
        return 0
    return text.count("prompt eval time") - text.count("# lucebox: warm-up answered")


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=CLIENT_TIMEOUT_S,
        check=False,
    )


LUCEBOX = [sys.executable, "-m", "lucebox.app.cli"]


@pytest.mark.parametrize("way", ["connect", "launch"])
@pytest.mark.parametrize(
    "client", ["llm", "continue", "opencode", "aider", "claude-code", "codex", "qwen-code"]
)
def test_client_answers_on_the_first_try(client, way, agent_server, clients_path, tmp_path):
    paths, served = agent_server
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = clean_env(home, paths.config_dir.parent, clients_path)
    argv = client_argv(client, served.model or "")
    warned = TOO_LONG in run([*LUCEBOX, "connect", client], env, work).stderr
    before = prompts_served(paths)
    if way == "connect":
        setup = run([*LUCEBOX, "connect", client, "--write"], env, work)
        assert setup.returncode == 0, setup.stderr
        assert (TOO_LONG in setup.stderr) == warned
        if warned:
            return  # told before anything ran; the request would be refused
        done = run(argv, env, work)
    elif warned:
        # launch says so too, then runs the client as asked (here: only its version).
        done = run([*LUCEBOX, "launch", client, "--", "--version"], env, work)
        assert done.returncode == 0 and TOO_LONG in done.stderr, done.stderr
        return
    else:
        done = run([*LUCEBOX, "launch", client, "--", *argv[1:]], env, work)
    if client == "claude-code" and "output token maximum" in done.stdout:
        # A reply came back and ran into the limit connect set: SmolLM2 often runs on, and
        # Claude Code reports that as an error rather than print the cut reply.
        assert prompts_served(paths) > before
        return
    report = (
        f"{client} via {way}: rc {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    )
    assert done.returncode == 0, report
    assert prompts_served(paths) > before, report
    assert done.stdout.strip(), report


def test_launch_starts_a_keyed_server_and_connect_remembers_it(
    built_engine_home, clients_path, tmp_path
):
    """launch with no server: it starts one (the preset, with a key of the user's), then the
    client sends the real key; once the server is down connect says so and keeps its address."""
    lucebox_home = private_engine_home(tmp_path / "lucebox-home")
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = clean_env(home, lucebox_home, clients_path)
    port = free_port()
    settings = {"preset": "smollm2", "server.port": str(port), "server.api_key": "lb-e2e-key"}
    settings["model.ctx"] = "4096"
    for key, value in settings.items():
        assert run([*LUCEBOX, "config", "set", key, value], env, work).returncode == 0
    paths = resolve_paths({"LUCEBOX_HOME": str(lucebox_home)})
    try:
        done = run([*LUCEBOX, "launch", "llm", "--", "-m", "smollm2", PROMPT], env, work)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "starting the server" in done.stdout and done.stdout.strip()
        assert prompts_served(paths) == 1
    finally:
        run([*LUCEBOX, "down"], env, work)
    keys = json.loads((home / ".config" / "io.datasette.llm" / "keys.json").read_text())
    assert keys["lucebox"] == "lb-e2e-key"
    later = run([*LUCEBOX, "connect", "qwen-code"], env, work)
    assert later.returncode == 0, later.stderr
    assert "no server is running" in later.stderr and f"127.0.0.1:{port}" in later.stderr
    assert TOO_LONG in later.stderr  # Qwen Code's own prompt is longer than 4096 tokens
    assert "lb-e2e-key" not in later.stdout + later.stderr  # the key is never printed
    restored = run([*LUCEBOX, "launch", "llm", "--restore"], env, work)
    assert (
        restored.returncode == 0
        and not (home / ".config" / "io.datasette.llm" / "keys.json").exists()
    )
