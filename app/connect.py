"""``lucebox connect CLIENT [--write]``: point a coding agent or SDK at this server."""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lucebox.engine.core.errors import EXIT_OK, UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.machine import config
from lucebox.engine.machine.apikey import client_api_key
from lucebox.engine.machine.connect import CLIENTS, Endpoint, setup_for, write_setup
from lucebox.engine.plan.launch import url_of_address
from lucebox.engine.run import runstate
from lucebox.engine.run.servedmodels import find_model


def endpoint_of(paths: Paths, model: str | None = None) -> Endpoint:
    """The running server's URL and model (``model`` of a served set, else its first), else
    the configured address and preset."""
    settings = config.load_settings(paths)
    api_key = client_api_key(paths, settings.api_key)
    status = runstate.current_status(paths)
    if status.state != "stopped" and status.url is not None and status.models:
        chosen = find_model(status.models, model) if model else status.models[0]
        aliases = tuple(m.alias for m in status.models)
        return Endpoint(status.url, chosen.alias, api_key, aliases)
    if model is not None:
        raise UsageError(
            f"--model {model} names a model of a served set, and none is served",
            hint="leave --model out, or start the set (`lucebox serve --model A --model B`)",
        )
    if status.state != "stopped" and status.url is not None and status.model is not None:
        return Endpoint(status.url, status.model, api_key)
    if not settings.preset:
        raise UsageError(
            "no server is running and no preset is set, so the model alias is unknown",
            hint="start the server (`lucebox serve`) and run `lucebox connect` again",
        )
    return Endpoint(url_of_address(settings.host, settings.port), settings.preset, api_key)


def cmd_connect(args: argparse.Namespace, paths: Paths) -> int:
    endpoint = endpoint_of(paths, args.model)
    setup = setup_for(args.client, endpoint, Path.home())
    written = backup = None
    if args.write:
        written, backup = write_setup(setup)
    if args.json:
        document: dict[str, Any] = {
            "client": setup.client,
            "base_url": endpoint.url,
            "model": endpoint.model,
            "env": dict(setup.env),
            "config_path": None if setup.config_path is None else str(setup.config_path),
            "written": written is not None,
            "backup": None if backup is None else str(backup),
        }
        print(json.dumps(document, indent=2))
        return EXIT_OK
    print(f"# {setup.client} -> {endpoint.url} (model {endpoint.model})")
    for name, value in setup.env:
        print(f"export {name}={shlex.quote(value)}")
    if written is not None:
        print(f"# merged into {written}" + (f" (old file kept as {backup})" if backup else ""))
    elif setup.config_path is not None and setup.merge is not None:
        print(f"# {setup.config_path} (with --write lucebox merges this in, keeping a backup):")
        print(setup.merge(None), end="")
    for note in setup.notes:
        print(f"# {note}")
    return EXIT_OK


def add_connect_command(commands: Any, command: Callable[..., argparse.ArgumentParser]) -> None:
    connect = command(
        "connect",
        "settings that point a coding agent or SDK at this server",
        cmd_connect,
        commands,
    )
    connect.add_argument("client", choices=CLIENTS, metavar="CLIENT", help=", ".join(CLIENTS))
    connect.add_argument(
        "--write", action="store_true", help="merge into the client's config file (keeps a backup)"
    )
    connect.add_argument("--json", action="store_true", help="print the result as JSON")
    connect.add_argument(
        "--model", metavar="ALIAS", help="of a served set, the model the client starts with"
    )
