"""What the ``lucebox`` commands share: ``--json``, how JSON is printed, how a plan is shown,
the launch options."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from lucebox.engine.core.errors import EXIT_OK, GuardRefusal
from lucebox.engine.core.paths import Paths
from lucebox.engine.models import hubrepo
from lucebox.engine.models.presets import load_presets
from lucebox.engine.models.shortname import is_short_name, match_name
from lucebox.engine.plan.options import (
    LAUNCH_FLAGS,
    ServeOptions,
    options_from,
    refuse_second_model,
)

NAME_HELP = (
    "the model by short name: a family with an optional size or quant tag (qwen3.6, "
    "qwen3.6:27b, gemma4:31b-q4_k_m), a preset id, or OWNER/REPO[:QUANT]"
)


def print_json(value: object) -> None:
    print(json.dumps(value, indent=2, sort_keys=False))


def show_plan(
    document: Callable[[], object],
    print_text: Callable[[], None],
    refusal: GuardRefusal | None,
    *,
    as_json: bool,
) -> int:
    """A plan printed as JSON or as text, then its refusal raised (exit 3); else exit 0."""
    if as_json:
        print_json(document())
    else:
        print_text()
    if refusal is not None:
        raise refusal
    return EXIT_OK


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def add_launch_options(parser: argparse.ArgumentParser) -> None:
    """The options every planned launch takes: `up`, `serve` and `plan` share them."""
    parser.add_argument("name", nargs="?", metavar="NAME", help=NAME_HELP)
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


def serve_options(args: argparse.Namespace, paths: Paths) -> ServeOptions:
    """The launch options of the command line, a short name resolved once and said."""
    options = options_from(vars(args))
    name: str | None = getattr(args, "name", None)
    if not name:
        return options
    if not is_short_name(name):
        if options.names_a_model:
            refuse_second_model(name)
        return options_from({**vars(args), "model": [name]})
    match = match_name(name, load_presets(paths), hubrepo.repo_ids)
    print(f"lucebox: {match.why}", file=sys.stderr)
    return options.named(match)
