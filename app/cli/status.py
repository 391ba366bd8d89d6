"""`lucebox status`, `down` and `logs`: answered from the run-state file alone.

A status bar or a script may ask every second, so these commands import nothing heavy (no
HTTP client, no TUI, no GGUF reader): `lucebox` dispatches to :func:`main` here before it
loads the rest of the command line.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lucebox.app.cli.handler import Command, command, run_handler
from lucebox.app.cli.service import describe
from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.errors import EXIT_OK, UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.core.units import gib_text
from lucebox.engine.engines import updatestate
from lucebox.engine.machine import systemd
from lucebox.engine.run import runstate
from lucebox.engine.run.front.prometheus import prometheus_text
from lucebox.engine.run.servedsetmodels import ModelStatus, find_model
from lucebox.engine.run.sleep import SleepStatus

COMMANDS = ("status", "down", "logs")
WATCH_POLL_S = 0.25
"""How often --watch reads the state file; the server rewrites it once a second."""


def _number(value: float | None, unit: str, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f} {unit}"


def _kept_lines(status: runstate.Status) -> str:
    """What the engine kept of conversations across restarts: the slot restored at its start
    and the disk prefix cache."""
    cache = status.cache
    if cache is None:
        return ""
    lines = f"\n  last restore: {cache.last_restore}" if cache.last_restore else ""
    if cache.disk_bytes is not None and cache.disk_store == "slots":
        lines += (
            f"\n  saved conversations: {cache.disk_entries} ({cache.disk_tokens or 0} tokens), "
            f"{gib_text(cache.disk_bytes)}"
        )
    elif cache.disk_bytes is not None:
        lines += (
            f"\n  disk prefix cache: {cache.disk_entries} prompt states, "
            f"{gib_text(cache.disk_bytes)}"
        )
    return lines


def status_line(status: runstate.Status, unit: systemd.ServiceStatus) -> str:
    """Lines for people: the service, the state and model, and the latest rates."""
    service = f"service: {describe(unit)}\n" if unit.installed else ""
    if status.state == "stopped":
        return f"{service}stopped: no lucebox server is running (`lucebox serve` starts one)"
    head = (
        f"{service}{status.state}: {status.model} at {status.url} (pid {status.pid}, "
        f"up {status.uptime_s():.0f} s, {status.restarts} restarts"
        + (f", {status.planned_restarts} on purpose" if status.planned_restarts else "")
        + ")"
    )
    if status.engine is not None:
        head += f"\n  engine: {status.engine.text()}"
        if status.engine.chosen_by == "measured" and status.engine.reason:
            # The verdict's figures, each engine's with its runs' spread where it ran again.
            head += f"\n    {status.engine.reason}"
    if status.sleep is not None:
        head += f"\n  {sleep_line(status.sleep)}"
    if status.cause is not None:
        head += f"\n  last exit: {status.cause.code}: {status.cause.sentence}"
    if status.webui_url:
        head += f"\n  chat in a browser: {status.webui_url}"
    if status.lan is not None:
        head += f"\n  on the LAN: {', '.join(status.lan.chat_urls())} (`lucebox share`)"
    if status.keys:
        used = ", ".join(f"{k.name} {k.requests} requests" for k in status.keys)
        head += f"\n  keys: {used}"
    if status.sampling is not None:
        head += f"\n  sampling: {status.sampling.text()}"
    spec = status.spec
    apart = spec.sampling_text() if spec is not None else None
    if spec is not None and apart is not None:
        head += f"\n  speculation: {spec.mode_name} · {apart}"
    head += "".join(f"\n  {model_line(model)}" for model in status.models)
    head += _kept_lines(status)
    head += "".join(
        f"\n  {side.role} model: {side.alias}, {'ready' if side.ready else 'starting'}"
        + (f", {side.restarts} restarts" if side.restarts else "")
        for side in status.sides
    )
    sample = status.sample
    if sample is None:
        return head
    parts = [
        f"decode {_number(sample.decode_tokens_per_s, 'tok/s')}",
        f"prefill {_number(sample.prefill_tokens_per_s, 'tok/s')}",
        f"engine TTFT {_number(sample.ttft_s, 's', 2)}",
        f"{sample.requests_finished_total} requests",
    ]
    if status.cache is not None and status.cache.cached_prompt_share is not None:
        parts.append(f"prompt cached {status.cache.cached_prompt_share:.0%}")
    if spec is not None and apart is None and spec.acceptance is not None:
        parts.append(f"draft accepted {spec.acceptance:.0%}")
    if spec is not None and apart is None and (headline := spec.headline()) is not None:
        parts.append(headline)
    if sample.vram_used_bytes is not None:
        parts.append(f"VRAM {gib_text(sample.vram_used_bytes, 2)}")
    text = f"{head}\n  " + ", ".join(parts) + f" (last {sample.window_s:.0f} s)"
    if status.kv_modes is not None and (lines := status.kv_modes.lines()):
        text += "\n  long-context modes, measured on this card:"
        text += "".join(f"\n    {line}" for line in lines)
    return text


def sleep_line(sleep: SleepStatus) -> str:
    """Asleep or awake, since when (local time), and what wakes it or puts it to sleep."""
    since = time.strftime("%H:%M:%S", time.localtime(sleep.since))
    if sleep.asleep:
        return f"asleep since {since} (memory freed): the next request wakes it"
    return f"awake since {since}: sleeps after {sleep.idle_s:.0f} s without requests"


def model_line(model: ModelStatus) -> str:
    """One model of a served set for people: state, memory, last use, device."""
    used = "never used" if model.last_used_s is None else f"used {model.last_used_s:.0f} s ago"
    held = f"{gib_text(model.memory_bytes, 2)} of {gib_text(model.planned_bytes, 2)} planned"
    slot = f"; slot {model.last_slot}" if model.last_slot else ""
    return f"{model.alias}: {model.state}, {held}, {used} ({model.device}){slot}"


def _show(status: runstate.Status, args: argparse.Namespace, paths: Paths) -> None:
    # The textfile first: whoever reads the line may look at the file next.
    if args.prometheus is not None:
        try:
            write_text_atomic(args.prometheus, prometheus_text(status), durable=False)
        except OSError as exc:
            raise UsageError(
                f"cannot write {args.prometheus}: {exc.strerror or exc}",
                hint="give a writable path for --prometheus",
            ) from exc
    unit = systemd.service_status()
    if args.json:
        document = {
            **status.to_json(),
            "service": unit.to_json(),
            "engine_update": _engine_update(paths),
        }
        # One line per sample while watching (NDJSON), an indented document otherwise.
        print(json.dumps(document, indent=None if args.watch else 2), flush=True)
    else:
        print(status_line(status, unit), flush=True)
        state = updatestate.read_state(paths)
        if state is not None and state.auto_rollback is not None:
            print(f"engine rolled back by itself: {state.auto_rollback.why}", flush=True)


def _engine_update(paths: Paths) -> dict[str, object] | None:
    """The last switch of the active build and, when lucebox took it back by itself, why."""
    state = updatestate.read_state(paths)
    return state.to_json() if state is not None else None


def _sample_key(status: runstate.Status) -> tuple[object, ...]:
    """What makes a new line while watching: a new sample, or a change of state."""
    models = tuple((m.alias, m.state) for m in status.models)
    return (status.state, status.pid, status.sample.at_s if status.sample else None, models)


def cmd_status(args: argparse.Namespace, paths: Paths) -> int:
    status = runstate.current_status(paths)
    if args.model is not None:
        model = find_model(status.models, args.model)
        print(json.dumps(model.to_json(), indent=2) if args.json else model_line(model))
        return EXIT_OK
    _show(status, args, paths)
    if not args.watch:
        return EXIT_OK
    shown = _sample_key(status)
    # A status bar or a service manager ends the watch with SIGTERM (SIGINT may be ignored in
    # a background job): both end it quietly.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        while True:
            time.sleep(WATCH_POLL_S)
            status = runstate.current_status(paths)
            if (key := _sample_key(status)) != shown:
                shown = key
                _show(status, args, paths)
    except KeyboardInterrupt:
        return EXIT_OK


def cmd_down(args: argparse.Namespace, paths: Paths) -> int:
    pid = runstate.stop_server(paths)
    if pid is None:
        print("no lucebox server was running")
        return EXIT_OK
    print(f"stopped lucebox (pid {pid})")
    failure = runstate.slot_save_failure(paths, pid)
    if failure is not None:
        print(
            f"the conversation cache was not saved on this stop: {failure}; the next start "
            "reads the agent's prompt again",
            file=sys.stderr,
        )
    return EXIT_OK


def cmd_logs(args: argparse.Namespace, paths: Paths) -> int:
    log = runstate.engine_log(paths)
    if not log.exists():
        raise UsageError(
            f"no engine log yet at {log}", hint="start the server with `lucebox serve`"
        )
    with log.open(encoding="utf-8", errors="replace") as handle:
        sys.stdout.write(handle.read())
        sys.stdout.flush()
        while args.follow:
            line = handle.readline()
            if line:
                sys.stdout.write(line)
                sys.stdout.flush()
            else:
                time.sleep(0.25)
    return EXIT_OK


def register(commands: Any, command: Command) -> None:
    """``status``, ``down`` and ``logs``, through the command line's ``command`` helper."""
    status = command(
        "status", "state of the running server and its latest sample", cmd_status, commands
    )
    status.add_argument("--json", action="store_true", help="print the result as JSON")
    status.add_argument(
        "--watch", action="store_true", help="print a line per sample (NDJSON with --json)"
    )
    status.add_argument(
        "--prometheus", type=Path, metavar="FILE", help="also write a Prometheus textfile"
    )
    status.add_argument("--model", metavar="ALIAS", help="one model of a served set")
    command("down", "stop the running server", cmd_down, commands)
    logs = command("logs", "show the server log", cmd_logs, commands)
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")


def main(argv: Sequence[str]) -> int:
    """Run one of :data:`COMMANDS` without loading the rest of the command line."""
    parser = argparse.ArgumentParser(prog="lucebox")
    commands = parser.add_subparsers(dest="command", required=True)

    register(commands, command)
    return run_handler(parser.parse_args(argv))
