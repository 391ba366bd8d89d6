"""``lucebox models update | rollback | prune``: a pulled model moves to its repo's newest
revision only when asked, after its guards and a load test, and the revision it replaced stays
on disk as the way back until pruned."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, NoReturn

from lucebox.app.cli.args import add_json, print_json
from lucebox.app.cli.handler import Command
from lucebox.app.cli.progress import transfer_progress
from lucebox.engine.bench import selftest
from lucebox.engine.core.errors import EXIT_OK, GuardRefusal, UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.core.units import gib_text
from lucebox.engine.engines import registry
from lucebox.engine.machine import config, gpu
from lucebox.engine.models import checkresult, guard, modelupdate, revisions
from lucebox.engine.models.hubpull import pull_revision
from lucebox.engine.models.pull import retry_policy
from lucebox.engine.models.records import ModelRecord, find_model, list_models
from lucebox.engine.plan.flagtypes import positive_int
from lucebox.engine.plan.options import ServeOptions
from lucebox.engine.run.runstate import current_status


def _short(revision: str | None) -> str:
    return (revision or "unknown")[:12]


def _refuse_while_serving(paths: Paths) -> None:
    running = current_status(paths)
    if running.state != "stopped":
        raise UsageError(
            f"lucebox serves {running.model} at {running.url}: the load test needs the memory "
            "that server holds",
            hint="stop it with `lucebox down`, update, then start it again",
        )


def _guard(paths: Paths, new: ModelRecord) -> checkresult.CheckResult:
    settings = config.load_settings(paths)
    selection = registry.select_engine(paths, gpu.probe_gpus(), settings.engine_id)
    archs = registry.known_model_archs(paths, selection)
    return guard.check_model(new.main_path, allow_base=settings.allow_base, known_archs=archs)


def _refuse(paths: Paths, old: ModelRecord, new: ModelRecord, why: str, hint: str) -> NoReturn:
    revisions.discard(paths, new)
    raise GuardRefusal(
        f"revision {_short(new.revision)} of {old.name} {why}: {old.name} stays at revision "
        f"{_short(old.revision)}",
        hint=hint,
    )


def _update_one(args: argparse.Namespace, paths: Paths, record: ModelRecord) -> dict[str, Any]:
    """Check, pull, guard, load and switch one model; the JSON of what happened."""
    check = modelupdate.check_revision(record)
    result: dict[str, Any] = {**check.to_json(), "switched": False, "load_test": None}
    if not check.newer:
        if not args.json:
            print(f"{record.name}: up to date (revision {_short(check.newest)} of {check.repo_id})")
        return result
    _refuse_while_serving(paths)
    print(
        f"models update: {record.name} {_short(check.current)} -> {_short(check.newest)}: "
        f"pulling {', '.join(check.changed)}",
        file=sys.stderr,
    )
    settings = config.load_settings(paths)
    try:
        new, changed = pull_revision(
            paths,
            record,
            check.newest,
            transfer_progress("models update"),
            None,
            retry_policy(settings),
        )
    except GuardRefusal as exc:
        raise GuardRefusal(
            f"revision {_short(check.newest)} of {record.name} was refused: {exc.message}; "
            f"{record.name} stays at revision {_short(check.current)}",
            hint=exc.hint,
        ) from exc
    checked = _guard(paths, new)
    if not checked.usable:
        problems = "; ".join(f"{p.code}: {p.message}" for p in checked.problems)
        _refuse(paths, record, new, f"failed its guard ({problems})", "`lucebox models check PATH`")
    if registry.list_engines(paths):
        options = ServeOptions(model=str(new.main_path), ctx=args.ctx)
        load = selftest.load_test(paths, options)
        result["load_test"] = load.to_json()
        if not load.passed:
            _refuse(
                paths,
                record,
                new,
                f"did not pass its load test ({load.detail})",
                "`lucebox models check PATH`; the Hub's revision may be broken",
            )
    revisions.switch(paths, record, new)
    result |= {"switched": True, "pulled_files": list(changed)}
    if not args.json:
        load_line = (
            result["load_test"]["detail"]
            if result["load_test"]
            else "not load-tested: no engine is built yet"
        )
        print(
            f"{record.name}: switched to revision {_short(new.revision)} ({', '.join(changed)} "
            f"pulled; {load_line}); `lucebox models rollback {record.name}` goes back"
        )
    return result


def cmd_models_update(args: argparse.Namespace, paths: Paths) -> int:
    if args.name:
        records = [find_model(paths, args.name)]
    else:
        records = [r for r in list_models(paths) if modelupdate.updatable(r)]
    results = [_update_one(args, paths, record) for record in records]
    if args.json:
        print_json({"models": results})
    elif not records:
        print("no model pulled from the Hub: nothing to update")
    return EXIT_OK


def cmd_models_rollback(args: argparse.Namespace, paths: Paths) -> int:
    current, back = revisions.rollback(paths, args.name)
    if args.json:
        print_json(
            {
                "name": args.name,
                "from_revision": current.revision,
                "to_revision": back.revision,
            }
        )
    else:
        print(
            f"{args.name}: back to revision {_short(back.revision)} from "
            f"{_short(current.revision)} (nothing downloaded); it serves from the next start"
        )
    return EXIT_OK


def cmd_models_prune(args: argparse.Namespace, paths: Paths) -> int:
    forgotten, deleted = revisions.prune(paths, args.name)
    freed = sum(f.size_bytes for r in forgotten for f in r.files if Path(f.path) in deleted)
    if args.json:
        print_json(
            {
                "revisions": [{"name": r.name, "revision": r.revision} for r in forgotten],
                "deleted": [str(p) for p in deleted],
                "freed_bytes": freed,
            }
        )
    elif not forgotten:
        print("no earlier revision is kept: nothing to prune")
    else:
        for record in forgotten:
            print(f"forgot {record.name} revision {_short(record.revision)}")
        print(f"deleted {len(deleted)} file(s); freed {gib_text(freed, 2)}")
    return EXIT_OK


def register(subs: Any, command: Command) -> None:
    """The revision subcommands of ``lucebox models``."""
    update = command(
        "update",
        "move pulled models to their repo's newest revision (guards and a load test first)",
        cmd_models_update,
        subs,
    )
    update.add_argument("name", metavar="NAME", nargs="?", help="one model (default: all)")
    update.add_argument("--ctx", type=positive_int, metavar="N", help="context of the load test")
    add_json(update)
    rollback = command(
        "rollback",
        "back to the revision the last `models update` replaced",
        cmd_models_rollback,
        subs,
    )
    rollback.add_argument("name", metavar="NAME")
    add_json(rollback)
    prune = command(
        "prune",
        "delete the revisions `models update` kept as the way back",
        cmd_models_prune,
        subs,
    )
    prune.add_argument("name", metavar="NAME", nargs="?", help="one model (default: all)")
    add_json(prune)
