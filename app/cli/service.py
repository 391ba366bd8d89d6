"""``lucebox service install|uninstall|status``: the CLI over the systemd units of the engine."""

from __future__ import annotations

import argparse
import json
import os
import pwd
import sys
from typing import TYPE_CHECKING, Any

from lucebox.app.cli.handler import Command, group_help
from lucebox.engine.core.errors import EXIT_OK
from lucebox.engine.machine import systemd
from lucebox.engine.machine.unit import SYSTEM_HOME, SYSTEM_USER, Scope

if TYPE_CHECKING:
    from lucebox.engine.core.paths import Paths


def _scope(args: argparse.Namespace) -> Scope:
    return "system" if args.system else "user"


def _log_hint(scope: Scope) -> str:
    flag = " --user" if scope == "user" else ""
    return f"logs: journalctl{flag} -u lucebox -f; state: systemctl{flag} status lucebox"


def _offer_linger() -> None:
    """User services start at login; lingering starts them at boot. Asked, never assumed."""
    user = pwd.getpwuid(os.getuid()).pw_name
    if systemd.linger_enabled(user):
        return
    command = f"loginctl enable-linger {user}"
    if not sys.stdin.isatty():
        print(f"to start it at boot rather than at your login: {command}")
        return
    answer = input(f"Start lucebox at boot, before you log in? (runs `{command}`) [y/N] ")
    if answer.strip().lower() in ("y", "yes"):
        systemd.enable_linger(user)
        print(f"lingering enabled for {user}")


def cmd_install(args: argparse.Namespace, paths: Paths) -> int:
    scope = _scope(args)
    plan = systemd.plan_install(scope)
    if args.dry_run:
        if scope == "system":
            print(
                f"# first: create the user {SYSTEM_USER}, then as that user pull the models and"
                f" build the engine in {SYSTEM_HOME}"
            )
        print(f"# {plan.files.unit_file}\n{plan.unit_text}")
        if plan.desktop_text is not None:
            print(f"# {plan.files.desktop_file}\n{plan.desktop_text}")
            print(f"# {plan.files.icon_file}: the icon")
        return EXIT_OK
    if scope == "system":
        systemd.require_root("install")
        systemd.prepare_system_home()
    result = systemd.install(plan)
    for path in result.files.written():
        print(f"wrote {path}")
    state = "enabled and started" if result.started else "enabled"
    print(f"lucebox.service ({scope}) is {state}")
    for note in result.notes:
        print(note)
    if scope == "user":
        _offer_linger()
    print(_log_hint(scope))
    return EXIT_OK


def cmd_uninstall(args: argparse.Namespace, paths: Paths) -> int:
    scope = _scope(args)
    files = systemd.service_files(scope)
    if args.dry_run:
        for path in files.written():
            print(f"would remove {path}" if path.exists() else f"absent: {path}")
        return EXIT_OK
    if scope == "system":
        systemd.require_root("uninstall")
    removed = systemd.uninstall(scope)
    if not removed:
        print(f"lucebox.service ({scope}) was not installed")
    for path in removed:
        print(f"removed {path}")
    if removed and scope == "system":
        print(f"kept the user {SYSTEM_USER} and its models in {SYSTEM_HOME}")
    return EXIT_OK


def describe(status: systemd.ServiceStatus) -> str:
    if not status.installed:
        return "not installed (`lucebox service install` runs lucebox at boot)"
    return f"installed ({status.scope}), {'enabled' if status.enabled else 'disabled'}"


def cmd_status(args: argparse.Namespace, paths: Paths) -> int:
    status = systemd.service_status()
    if args.json:
        print(json.dumps(status.to_json(), indent=2))
    else:
        print(describe(status))
    return EXIT_OK


def register(commands: Any, command: Command) -> None:
    """``lucebox service`` and its subcommands."""
    service: argparse.ArgumentParser = command(
        "service",
        "run lucebox at boot as a systemd service",
        lambda a, p: group_help(service),
        commands,
    )
    subs = service.add_subparsers(dest="service_command", metavar="COMMAND")
    for name, help_text, handler in (
        ("install", "run `lucebox serve` at boot as a systemd service", cmd_install),
        ("uninstall", "stop and remove the service", cmd_uninstall),
    ):
        sub = subs.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        which = sub.add_mutually_exclusive_group()
        which.add_argument("--user", action="store_true", help="a service of yours (default)")
        which.add_argument(
            "--system", action="store_true", help=f"a system service run as user {SYSTEM_USER}"
        )
        sub.add_argument("--dry-run", action="store_true", help="print what it would do")
    status = subs.add_parser("status", help="whether the service is installed and enabled")
    status.set_defaults(handler=cmd_status)
    status.add_argument("--json", action="store_true", help="print the result as JSON")
