"""What the ``lucebox`` commands share: ``--json``, how JSON is printed, the launch options."""

from __future__ import annotations

import argparse
import json
from typing import Any

from lucebox.engine.plan.options import LAUNCH_FLAGS, ServeOptions, options_from


def print_json(value: object) -> None:
    print(json.dumps(value, indent=2, sort_keys=False))


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def add_launch_options(parser: argparse.ArgumentParser) -> None:
    """The options every planned launch takes: `up`, `serve` and `plan` share them."""
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for flag in LAUNCH_FLAGS:
        holder: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup = parser
        if flag.exclusive:
            if flag.exclusive not in groups:
                groups[flag.exclusive] = parser.add_mutually_exclusive_group()
            holder = groups[flag.exclusive]
        reads: dict[str, Any] = {"action": "store_true"} if flag.switch else {}
        if flag.repeat:
            reads["action"] = "append"
        if flag.parse is not None:
            reads["type"] = flag.parse
        if flag.choices is not None:
            reads["choices"] = flag.choices
        if flag.metavar is not None:
            reads["metavar"] = flag.metavar
        holder.add_argument(flag.name, dest=flag.field, help=flag.help, **reads)


def serve_options(args: argparse.Namespace) -> ServeOptions:
    return options_from(vars(args))
