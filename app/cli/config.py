"""``lucebox config``: show or change the settings in config.toml."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from lucebox.app.cli.args import add_json, print_json
from lucebox.app.cli.handler import Command, group_help
from lucebox.engine.core.errors import EXIT_OK
from lucebox.engine.core.paths import Paths
from lucebox.engine.machine import config


def cmd_config_show(args: argparse.Namespace, paths: Paths) -> int:
    settings = config.load_settings(paths)
    values = {key: getattr(settings, field) for key, field in config.KEYS.items()}
    if args.json:
        print_json({"path": str(paths.config_file), "settings": values})
    else:
        print(f"# {paths.config_file}")
        if os.environ.get(config.SETTINGS_ENV, "").strip():
            print(f"# with ${config.SETTINGS_ENV} layered over it")
        for key, value in values.items():
            print(f"{key} = {json.dumps(value)}")
    return EXIT_OK


def cmd_config_set(args: argparse.Namespace, paths: Paths) -> int:
    settings = config.set_setting(paths, args.key, args.value)
    value = getattr(settings, config.KEYS[args.key])
    print(f"{args.key} = {json.dumps(value)}  (saved to {paths.config_file})")
    return EXIT_OK


def cmd_config_path(args: argparse.Namespace, paths: Paths) -> int:
    print(paths.config_file)
    return EXIT_OK


def cmd_config_reset(args: argparse.Namespace, paths: Paths) -> int:
    kept = config.reset_config(paths)
    if kept is not None:
        print(f"kept the old file as {kept}", file=sys.stderr)
    print(f"wrote default settings to {paths.config_file}")
    return EXIT_OK


def register(commands: Any, command: Command) -> None:
    cfg: argparse.ArgumentParser = command(
        "config", "show or change settings in config.toml", lambda a, p: group_help(cfg), commands
    )
    cfg_cmds = cfg.add_subparsers(dest="config_command", metavar="COMMAND")
    show = command("show", "print every setting", cmd_config_show, cfg_cmds)
    add_json(show)
    setter = command("set", "change one setting", cmd_config_set, cfg_cmds)
    setter.add_argument("key", metavar="KEY", choices=list(config.KEYS))
    setter.add_argument("value", metavar="VALUE")
    command("path", "print where config.toml is", cmd_config_path, cfg_cmds)
    command(
        "reset",
        "keep config.toml aside as .bad-<time> and start from defaults",
        cmd_config_reset,
        cfg_cmds,
    )
