"""Run a parsed command: every error a user can cause becomes one line and its exit code;
anything else one line and the path of a log with the full traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from lucebox.engine.core.crashlog import write_crash_log
from lucebox.engine.core.errors import EXIT_CANCELLED, EXIT_FAILURE, EXIT_USAGE, LuceboxError
from lucebox.engine.core.paths import Paths, resolve_paths

Handler = Callable[[argparse.Namespace, Paths], int]
Command = Callable[..., argparse.ArgumentParser]
"""Registers a subcommand: (name, help, handler, parent) -> its parser (:func:`command`)."""


def command(name: str, help_text: str, handler: Handler, parent: Any) -> argparse.ArgumentParser:
    """Add ``name`` to ``parent`` (a subparsers action) with ``handler`` to run it."""
    sub: argparse.ArgumentParser = parent.add_parser(name, help=help_text, description=help_text)
    sub.set_defaults(handler=handler)
    return sub


def run_handler(args: argparse.Namespace) -> int:
    paths: Paths | None = None
    try:
        paths = resolve_paths()
        handler: Handler = args.handler
        return handler(args, paths)
    except LuceboxError as exc:
        print(f"lucebox: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("lucebox: interrupted", file=sys.stderr)
        return EXIT_CANCELLED
    except Exception as exc:
        log = write_crash_log(paths, exc)
        print(f"lucebox: unexpected error: {exc!r}; full log: {log}", file=sys.stderr)
        return EXIT_FAILURE


def group_help(parser: argparse.ArgumentParser) -> int:
    """A command group run without a subcommand: its help, exit 2."""
    parser.print_help(sys.stderr)
    return EXIT_USAGE
