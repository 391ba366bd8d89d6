"""``lucebox connect CLIENT [--write | --restore]``: point a coding agent or SDK at this server."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lucebox.app.cli.handler import Command
from lucebox.engine.core.errors import EXIT_OK, UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.machine import config
from lucebox.engine.machine.agentclients import CLIENTS, Where, setup_for
from lucebox.engine.machine.apikey import api_key_path, client_api_key
from lucebox.engine.machine.clientoriginal import keep_original, restore_originals
from lucebox.engine.machine.connect import (
    ClientSetup,
    Endpoint,
    EnvVar,
    Written,
    known_client,
    write_file,
)
from lucebox.engine.machine.personkeys import key_for_client
from lucebox.engine.plan.memory.agentprompt import ServedModel, prompt_warnings
from lucebox.engine.run import runstate
from lucebox.engine.run.lastserved import read_last_served
from lucebox.engine.run.sample import Sample
from lucebox.engine.run.servedsetmodels import find_model

MEASURED_PROMPT_TOKENS = 1000


@dataclass(frozen=True)
class Target:
    """The server a client is pointed at, and what the prompt warnings need to know of it."""

    endpoint: Endpoint
    running: bool
    served: ServedModel | None


def target_of(paths: Paths, alias: str | None = None) -> Target:
    """The running server, else the last one served; a usage error when none ever ran.

    ``alias`` picks the model of a served set the client starts with (else its first)."""
    settings = config.load_settings(paths)
    status = runstate.current_status(paths)
    last = read_last_served(paths)
    aliases: tuple[str, ...] = ()
    running_set = status.state != "stopped" and status.url is not None and status.models
    if alias is not None and not running_set:
        raise UsageError(
            f"--model {alias} names a model of a served set, and none is served",
            hint="leave --model out, or start the set (`lucebox serve --model A --model B`)",
        )
    if running_set and status.url is not None:
        chosen = find_model(status.models, alias) if alias else status.models[0]
        url, model, running = status.url, chosen.alias, True
        aliases = tuple(m.alias for m in status.models)
        if last is not None and last.url != status.url:
            last = None
    elif status.state != "stopped" and status.url is not None and status.model is not None:
        url, model, running = status.url, status.model, True
        if last is not None and last.url != status.url:
            last = None  # a record of another server: its facts are not this one's
    elif last is not None:
        url, model, running = last.url, last.model, False
        aliases = last.aliases if len(last.aliases) > 1 else ()
    else:
        raise UsageError(
            "no server is running and none has run with this lucebox home, so the address and"
            " model are unknown",
            hint="start the server (`lucebox up` or `lucebox serve`), then run this again",
        )
    key_file = api_key_path(paths)
    if last is not None:
        checks_key = last.api_key_file is not None
    else:
        checks_key = bool(settings.api_key) or key_file.exists()
    api_key = client_api_key(paths, settings.api_key) if checks_key else None
    ctx = (status.ctx if running else None) or (last.ctx if last is not None else None)
    served = None
    if last is not None and ctx is not None:
        measured = measured_prefill(status.sample) if running else None
        served = ServedModel(ctx, last.on_gpu, last.weights_bytes, last.cpu_cores, measured)
    embed_model = last.embed_model if last is not None else None
    endpoint = Endpoint(
        url, model, ctx, api_key, key_file if api_key else None, aliases, embed_model
    )
    return Target(endpoint, running, served)


def measured_prefill(sample: Sample | None) -> float | None:
    """The engine's prefill rate over the prompts it has served, once they say something of
    an agent's long prompt (short ones run faster per token)."""
    if sample is None or sample.prefill_tokens_total < MEASURED_PROMPT_TOKENS:
        return None
    if sample.prefill_seconds_total <= 0:
        return None
    return sample.prefill_tokens_total / sample.prefill_seconds_total


def where_for(paths: Paths) -> Where:
    home = Path.home()
    llm_dir = os.environ.get("LLM_USER_PATH")
    return Where(
        home,
        paths.state_dir / "clients",
        Path(llm_dir) if llm_dir else home / ".config" / "io.datasette.llm",
    )


def export_line(var: EnvVar, endpoint: Endpoint) -> str:
    if var.secret and endpoint.api_key_file is not None:
        return f'export {var.name}="$(cat {shlex.quote(str(endpoint.api_key_file))})"'
    return f"export {var.name}={shlex.quote(var.value)}"


def notices(client: str, target: Target) -> list[str]:
    """What to say before the client runs: a stopped server, a slow or too long prompt."""
    said = []
    endpoint = target.endpoint
    if not target.running:
        said.append(
            f"no server is running: these settings are for the last one served ({endpoint.model}"
            f" at {endpoint.url}); start it with `lucebox up`"
        )
    if target.served is not None:
        said += prompt_warnings(client, target.served, endpoint.output_tokens)
    return said


def write_all(paths: Paths, setup: ClientSetup, files: tuple[Any, ...]) -> list[Written]:
    def keep(path: Path, text: str | None) -> None:
        keep_original(paths, setup.client, path, text)

    return [write_file(file, keep) for file in files]


def cmd_connect(args: argparse.Namespace, paths: Paths) -> int:
    client = known_client(args.client, CLIENTS)
    if args.restore:
        return print_restored(paths, client)
    target = target_of(paths, args.model)
    if args.key is not None:
        target = with_person_key(paths, target, args.key)
    endpoint = target.endpoint
    setup = setup_for(client, endpoint, where_for(paths))
    said = notices(client, target)
    for line in said:
        print(f"lucebox note: {line}", file=sys.stderr)
    if args.write and not setup.files:
        raise UsageError(
            f"{client} has no config file: it reads environment variables",
            hint="put the printed export lines in your shell profile",
        )
    written = write_all(paths, setup, setup.files) if args.write else []
    if args.json:
        print(json.dumps(connect_json(setup, endpoint, written, said), indent=2))
        return EXIT_OK
    print(f"# {setup.client} -> {endpoint.url} (model {endpoint.model})")
    for var in setup.env:
        print(export_line(var, endpoint))
    for done in written:
        kept = f" (the file before is kept as {done.backup})" if done.backup else ""
        print(f"# merged into {done.path}{kept}")
        if done.dropped_comments:
            print(f"# {done.path.name} was rewritten without its comments; the backup has them")
    if not args.write:
        for file in setup.files:
            print(f"# {file.path} (with --write lucebox merges this in, keeping your original):")
            print(hide_key(file.merge(None), endpoint), end="")
    for note in setup.notes:
        print(f"# {note}")
    if written:
        print(f"# undo: lucebox connect {client} --restore")
    return EXIT_OK


def with_person_key(paths: Paths, target: Target, given: str) -> Target:
    """``target`` with a person's key (``--key NAME|KEY``) in place of the server's."""
    person = key_for_client(paths, given)
    made = " (made now: `lucebox keys list` shows it)" if person.made else ""
    print(f"lucebox: the client gets the key of '{person.name}'{made}", file=sys.stderr)
    endpoint = replace(target.endpoint, api_key=person.secret, api_key_file=person.path)
    return replace(target, endpoint=endpoint)


def hide_key(text: str, endpoint: Endpoint) -> str:
    """``text`` with the server's key replaced by where it is kept: printed output never
    shows it (a terminal's scrollback and shared screens are not private)."""
    if not endpoint.api_key:
        return text
    return text.replace(endpoint.api_key, f"<the key in {endpoint.api_key_file}>")


def connect_json(
    setup: ClientSetup, endpoint: Endpoint, written: list[Written], said: list[str]
) -> dict[str, Any]:
    return {
        "client": setup.client,
        "base_url": endpoint.url,
        "model": endpoint.model,
        "ctx": endpoint.ctx,
        "output_tokens": endpoint.output_tokens,
        "env": {var.name: var.value for var in setup.env if not var.secret},
        "secret_env": [var.name for var in setup.env if var.secret],
        "config_paths": [str(file.path) for file in setup.files],
        "written": [str(done.path) for done in written],
        "backups": [str(done.backup) for done in written if done.backup],
        "warnings": said,
    }


def print_restored(paths: Paths, client: str) -> int:
    restored = restore_originals(paths, client)
    if not restored:
        print(f"nothing to restore: lucebox has not changed {client}'s files")
    for item in restored:
        done = "removed (it did not exist before lucebox)" if item.removed else "restored"
        print(f"{item.path}: {done}")
        if item.backup is not None:
            print(f"  its last content is kept as {item.backup}")
    return EXIT_OK


def add_client_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("client", metavar="CLIENT", help=", ".join(CLIENTS))
    parser.add_argument(
        "--restore",
        action="store_true",
        help="put back the client's files as they were before lucebox changed them",
    )


def register(commands: Any, command: Command) -> None:
    connect = command(
        "connect",
        "settings that point a coding agent or SDK at this server",
        cmd_connect,
        commands,
    )
    add_client_argument(connect)
    connect.add_argument(
        "--write",
        action="store_true",
        help="merge into the client's config files (your originals are kept for --restore)",
    )
    connect.add_argument("--json", action="store_true", help="print the result as JSON")
    connect.add_argument(
        "--model", metavar="ALIAS", help="of a served set, the model the client starts with"
    )
    connect.add_argument(
        "--key",
        metavar="NAME|KEY",
        help="a person's key instead of the server's: the key `keys add` printed, or a new "
        "name (a chat key is made for it)",
    )
