"""``lucebox launch CLIENT [--restore] [-- ARGS]``: the server up, then the client, set up.

The client runs in the foreground in place of lucebox, with its own environment variables or
command line options pointing it at the server, so the user's config files stay as they are;
where a client reads only its files (llm), the user's original is kept for ``--restore``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from typing import Any

from lucebox.app.cli.connect import (
    add_client_argument,
    notices,
    print_restored,
    target_of,
    where_for,
    write_all,
)
from lucebox.app.cli.handler import Command
from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.errors import ConfigError, LuceboxError, RunError, UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.machine.agentclients import CLIENTS, PROGRAMS
from lucebox.engine.machine.agentclients import setup_for as client_setup
from lucebox.engine.machine.connect import known_client
from lucebox.engine.run import runstate

INSTALL_HINTS = {
    "claude": "npm install -g @anthropic-ai/claude-code",
    "codex": "npm install -g @openai/codex",
    "opencode": "npm install -g opencode-ai",
    "qwen": "npm install -g @qwen-code/qwen-code",
    "cn": "npm install -g @continuedev/cli",
    "aider": "pipx install aider-chat",
    "llm": "pipx install llm",
}
READY_TIMEOUT_S = 3600.0
"""A first start may download a model and build the engine."""


def ensure_server(paths: Paths, *, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Return once a lucebox server is ready, starting one (as `up --headless --detach`)."""
    status = runstate.current_status(paths)
    if status.state == "ready":
        return
    if status.state == "stopped":
        pid, log = runstate.start_detached(paths, [])
        print(
            f"lucebox: starting the server in the background (pid {pid}, log {log}); it keeps"
            " running after the client ends: `lucebox down` stops it"
        )
    else:
        pid, log = status.pid or 0, paths.logs_dir / "serve.log"
        print(f"lucebox: waiting for the server ({status.state})", file=sys.stderr)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = runstate.current_status(paths)
        if status.state == "ready":
            return
        if status.state == "failed" or not runstate.pid_alive(pid):
            raise RunError(
                "the server did not start",
                hint=f"its log says why: {log}; `lucebox serve` shows it in the foreground",
            )
        time.sleep(0.5)
    raise RunError(f"the server was not ready within {timeout_s:.0f} s", hint=f"see its log: {log}")


def cmd_launch(args: argparse.Namespace, paths: Paths) -> int:
    client = known_client(args.client, CLIENTS)
    if args.restore:
        return print_restored(paths, client)
    client_args = list(args.client_args)
    # The check for the program comes first: nothing starts for a client that is not there.
    name = PROGRAMS.get(client)
    if name is None:
        raise UsageError(
            f"{client} is an SDK, not a program: there is nothing to launch",
            hint=f"`lucebox connect {client}` prints the variables it reads",
        )
    program = shutil.which(name)
    if program is None:
        raise UsageError(
            f"{client} is not installed here (no `{name}` on PATH)",
            hint=f"install it (`{INSTALL_HINTS[name]}`), then run this again",
        )
    ensure_server(paths)
    target = target_of(paths)
    setup = client_setup(client, target.endpoint, where_for(paths))
    for line in notices(client, target):
        print(f"lucebox note: {line}", file=sys.stderr)
    for path, text in setup.own_files:
        try:
            paths.ensure(path.parent)
            write_text_atomic(path, text)
        except OSError as exc:
            raise ConfigError(f"cannot write {path}: {exc.strerror}") from None
    for done in write_all(paths, setup, setup.launch_files):
        print(
            f"lucebox note: {client} reads only its files: merged into {done.path}"
            f" (`lucebox launch {client} --restore` puts your original back)",
            file=sys.stderr,
        )
    env = {**os.environ, **{var.name: var.value for var in setup.launch_env}}
    argv = [program, *setup.launch_args, *client_args]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(program, argv, env)
    except OSError as exc:
        raise LuceboxError(f"cannot run {program}: {exc.strerror}") from None


def register(commands: Any, command: Command) -> None:
    launch = command(
        "launch",
        "start the server if needed, then run a coding agent pointed at it",
        cmd_launch,
        commands,
    )
    add_client_argument(launch)
    launch.add_argument(
        "client_args", nargs="*", metavar="-- ARGS", help="passed to the client (after `--`)"
    )
