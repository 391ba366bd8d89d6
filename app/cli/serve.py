"""``lucebox up`` and ``lucebox serve``: the whole pipeline, with the dashboard or headless."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from lucebox.app.cli.args import add_json, add_launch_options, serve_options
from lucebox.app.cli.handler import Command
from lucebox.app.cli.plan import show_launch_plan
from lucebox.engine import pipeline, servedset
from lucebox.engine.core.downloadprogress import progress_parts
from lucebox.engine.core.errors import EXIT_FAILURE, EXIT_OK, UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.machine import config
from lucebox.engine.run import runstate
from lucebox.engine.servedchoice import ModelSet, served_choice


def cmd_serve(args: argparse.Namespace, paths: Paths) -> int:
    if args.vram_mib is not None and not args.dry_run:
        raise UsageError(
            "--vram-mib plans for a card that is not here, so it only goes with --dry-run",
            hint="add --dry-run, or use `lucebox plan --vram-mib N`",
        )
    options = serve_options(args, paths)  # once: a short name is resolved and said once
    if args.dry_run:
        return show_launch_plan(paths, options, as_json=args.json)
    prepare_only = getattr(args, "prepare_only", False)  # a serve flag; up has none
    if args.detach and not prepare_only:
        pid, log = runstate.start_detached(paths, options.to_args())
        print(f"lucebox serve runs in the background (pid {pid}); log: {log}")
        print("`lucebox status` shows it, `lucebox down` stops it")
        return EXIT_OK
    chosen = served_choice(options, config.load_settings(paths))
    if isinstance(chosen, ModelSet):
        if prepare_only:
            servedset.prepare_set(
                paths, chosen.options, chosen.sources, step_printer(), dry_run=False
            )
            return EXIT_OK
        return servedset.serve_set(paths, chosen.options, chosen.sources, step_printer())
    if prepare_only:
        pipeline.prepare(paths, chosen.options, step_printer())
        return EXIT_OK
    return pipeline.serve(paths, chosen.options, step_printer())


def step_printer() -> Callable[[pipeline.StepEvent], None]:
    """Pipeline events as log lines; a running download or build prints every 5%."""
    printed_marks: dict[str, tuple[str, int]] = {}

    def emit(event: pipeline.StepEvent) -> None:
        line = f"{event.step}: {event.message}"
        if event.fraction is not None:
            waiting = event.waiting_s is not None
            # A wait for a retry is printed once per attempt, progress once per 5%.
            mark = ("waiting", event.attempt or 0) if waiting else ("at", int(event.fraction * 20))
            if printed_marks.get(event.message) == mark:
                return
            printed_marks[event.message] = mark
            line += f": {event.fraction:.0%}"
            if event.attempt is not None:
                parts = progress_parts(
                    event.rate_bytes_per_s,
                    event.eta_s,
                    attempt=event.attempt,
                    waiting_s=event.waiting_s,
                    retry_reason=event.retry_reason,
                )
                line += ", " + ", ".join(parts)
        print(f"lucebox: {line}", flush=True)

    return emit


def cmd_up(args: argparse.Namespace, paths: Paths) -> int:
    if args.headless or args.detach or args.dry_run or args.vram_mib is not None:
        return cmd_serve(args, paths)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        print(
            "lucebox: no terminal for the dashboard; running headless (as `lucebox serve`)",
            file=sys.stderr,
        )
        return cmd_serve(args, paths)
    from lucebox.app.tui import make_app  # Textual loads only for the dashboard

    app = make_app(paths, serve_options(args, paths))
    app.run()
    return EXIT_FAILURE if app.return_code is None else app.return_code


def _add_serve_options(parser: argparse.ArgumentParser) -> None:
    add_launch_options(parser)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check and plan without downloading or starting anything; print the launch plan",
    )
    add_json(parser)


def register(commands: Any, command: Command) -> None:
    up = command(
        "up", "find the GPU, pick models, start and watch the server (TUI)", cmd_up, commands
    )
    _add_serve_options(up)
    up.add_argument("--headless", action="store_true", help="no TUI: same as `lucebox serve`")
    up.add_argument("--detach", action="store_true", help="run in the background")
    serve = command(
        "serve", "the whole pipeline headless in the foreground (for systemd)", cmd_serve, commands
    )
    _add_serve_options(serve)
    serve.add_argument("--detach", action="store_true", help="run in the background")
    serve.add_argument(
        "--prepare-only", action="store_true", help="pull models and build the engine, then exit"
    )
