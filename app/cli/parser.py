"""The whole ``lucebox`` command line: every group registered in ``lucebox --help``'s order.

Results go to stdout (``--json`` where a script may read them), progress to stderr. Every
error a user can cause is one line and an exit code from :mod:`lucebox.engine.core.errors`; an
unexpected error is one line plus the path of a log with the full traceback
(:mod:`lucebox.app.cli.handler`).
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Sequence

from lucebox.app.cli import (
    bench,
    config,
    connect,
    doctor,
    engine,
    keys,
    launch,
    models,
    plan,
    serve,
    service,
    share,
    status,
    worker,
)
from lucebox.app.cli.handler import command, run_handler

GROUPS = (
    serve, status, doctor, plan, models, engine, service, config, keys, share, bench, connect,
    launch, worker,
)  # fmt: skip
"""Each module registers its commands with ``register(commands, command)``."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lucebox",
        description="Turn this PC into a local LLM appliance: one GPU, one command.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    for group in GROUPS:
        group.register(commands, command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; ``argv`` None is this process's own command line, and it ends after."""
    code = _run(argv)
    if argv is None:
        # The process exits next. Its last garbage collection walks every object the imports
        # made (Textual, httpx, numpy): about half a second, most of quitting the dashboard.
        gc.freeze()
    return code


def _run(argv: Sequence[str] | None) -> int:
    return run_handler(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
