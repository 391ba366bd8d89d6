"""``lucebox keys add|list|revoke``: a key per person, over :mod:`personkeys`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lucebox.app.cli.args import add_json, print_json
from lucebox.app.cli.handler import Command, group_help
from lucebox.engine.core.errors import EXIT_OK
from lucebox.engine.core.paths import Paths
from lucebox.engine.machine.personkeys import (
    SCOPES,
    add_key,
    keys_path,
    read_keys,
    revoke_key,
)
from lucebox.engine.run import runstate


def cmd_keys_add(args: argparse.Namespace, paths: Paths) -> int:
    made, secret = add_key(paths, args.name, args.scope)
    if args.json:
        print_json({"name": made.name, "scope": made.scope, "key": secret})
        return EXIT_OK
    print(secret)
    print(
        f"lucebox: the key of '{made.name}' ({made.scope} scope); it is shown this once, "
        "and a running server takes it at once",
        file=sys.stderr,
    )
    return EXIT_OK


def cmd_keys_list(args: argparse.Namespace, paths: Paths) -> int:
    ring = read_keys(keys_path(paths))
    status = runstate.read_status(paths)
    live = status is not None and runstate.pid_alive(status.pid)
    use = {u.name: u.to_json() for u in status.keys} if status is not None and live else {}
    rows = [
        {"name": k.name, "scope": k.scope, "created_at": k.created_at, **use.get(k.name, {})}
        for k in ring.keys
    ]
    if args.json:
        print_json({"keys": rows})
        return EXIT_OK
    if not rows:
        print("no keys; `lucebox keys add NAME` makes one")
    for row in rows:
        used = (
            f"{row['requests']} requests, {row['tokens']} tokens, last {row['last_seen']}"
            if "requests" in row
            else "not used since the server started"
        )
        print(f"{row['name']:<20} {row['scope']:<7} made {row['created_at']}  {used}")
    return EXIT_OK


def cmd_keys_revoke(args: argparse.Namespace, paths: Paths) -> int:
    gone = revoke_key(paths, args.name)
    print(
        f"lucebox: revoked the key of '{gone.name}'; its next request is refused", file=sys.stderr
    )
    return EXIT_OK


def register(commands: Any, command: Command) -> None:
    keys: argparse.ArgumentParser = command(
        "keys", "a key per person: make, list and revoke", lambda a, p: group_help(keys), commands
    )
    subs = keys.add_subparsers(dest="keys_command", metavar="COMMAND")
    add = command("add", "make a key for a person or an app (printed once)", cmd_keys_add, subs)
    add.add_argument("name", metavar="NAME")
    add.add_argument(
        "--scope",
        choices=SCOPES,
        default="chat",
        help="chat (default: talk to the model), models (also load and unload a set's models), "
        "admin (every path)",
    )
    add_json(add)
    listed = command("list", "the keys, their scopes and what each used", cmd_keys_list, subs)
    add_json(listed)
    revoke = command(
        "revoke", "take a key back (its next request is refused)", cmd_keys_revoke, subs
    )
    revoke.add_argument("name", metavar="NAME")
