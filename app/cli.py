"""The ``lucebox`` command line: argparse front end over :mod:`lucebox.engine`.

Results go to stdout (``--json`` where a script may read them), progress to stderr. Every
error a user can cause is one line and an exit code from :mod:`lucebox.engine.core.errors`; an
unexpected error is one line plus the path of a log with the full traceback.

``build_parser`` lists every command in the order ``lucebox --help`` shows them; each command's
own options and handlers live in its module (modelscmd, enginecmd, connect, ...).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from lucebox.app import enginecmd, modelscmd, servicecmd, setcmd, status
from lucebox.app.bench import add_bench_commands
from lucebox.app.cliargs import add_json, print_json
from lucebox.app.connect import add_connect_command
from lucebox.app.handler import Handler, run_handler
from lucebox.app.launchcmd import add_launch_command
from lucebox.app.workercmd import add_worker_command
from lucebox.engine import doctor, pipeline, servedset
from lucebox.engine.core import units
from lucebox.engine.core.downloadprogress import progress_parts
from lucebox.engine.core.errors import (
    EXIT_FAILURE,
    EXIT_OK,
    GuardRefusal,
    UsageError,
)
from lucebox.engine.core.paths import Paths
from lucebox.engine.machine import config, gpu, peers
from lucebox.engine.plan import fitcheck, presetchoice
from lucebox.engine.plan.flagtypes import index_list, mib_list, peer_list, port_number, positive_int
from lucebox.engine.plan.launchplan import LaunchPlan, PlanRefusal
from lucebox.engine.plan.options import LAUNCH_FLAGS, ServeOptions, options_from
from lucebox.engine.run import runstate

# --- doctor -----------------------------------------------------------------------------------


def doctor_json(report: doctor.DoctorReport) -> dict[str, Any]:
    probe = report.probe
    return {
        "gpu_status": probe.status,
        "gpu_detail": probe.detail,
        "gpus": [
            {
                **{k: v for k, v in dataclasses.asdict(g).items() if k != "processes"},
                "driver_version": probe.driver_version,
                "cuda_driver_version": probe.cuda_driver_version,
                "processes": [dataclasses.asdict(p) for p in g.processes],
            }
            for g in probe.gpus
        ],
        "checks": [dataclasses.asdict(c) for c in report.checks],
    }


def cmd_doctor(args: argparse.Namespace, paths: Paths) -> int:
    settings = config.load_settings(paths)
    report = doctor.run_doctor(paths, gpu.probe_gpus(), settings.engine)
    if args.json:
        print_json(doctor_json(report))
        return EXIT_OK
    width = max(len(c.name) for c in report.checks)
    for check in report.checks:
        print(f"{check.verdict:<8} {check.name:<{width}}  {check.detail}")
        if check.action:
            print(f"{'':<8} {'':<{width}}  -> {check.action}")
    return EXIT_OK


# --- config -----------------------------------------------------------------------------------


def cmd_config_show(args: argparse.Namespace, paths: Paths) -> int:
    settings = config.load_settings(paths)
    values = {key: getattr(settings, field) for key, field in config.KEYS.items()}
    if args.json:
        print_json({"path": str(paths.config_file), "settings": values})
    else:
        print(f"# {paths.config_file}")
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


# --- serve (status, down and logs live in status.py) ---------------------------------------


def _serve_options(args: argparse.Namespace) -> ServeOptions:
    return options_from(vars(args))


def cmd_serve(args: argparse.Namespace, paths: Paths) -> int:
    if args.vram_mib is not None and not args.dry_run:
        raise UsageError(
            "--vram-mib plans for a card that is not here, so it only goes with --dry-run",
            hint="add --dry-run, or use `lucebox plan --vram-mib N`",
        )
    if args.dry_run:
        return show_launch_plan(paths, _serve_options(args), as_json=args.json)
    sources = servedset.served_sources(_serve_options(args), config.load_settings(paths))
    if sources and getattr(args, "prepare_only", False):
        servedset.prepare_set(paths, _serve_options(args), sources, step_printer(), dry_run=False)
        return EXIT_OK
    if sources and not args.detach:
        return servedset.serve_set(paths, _serve_options(args), sources, step_printer())
    if args.detach:
        pid, log = runstate.start_detached(paths, _serve_options(args).to_args())
        print(f"lucebox serve runs in the background (pid {pid}); log: {log}")
        print("`lucebox status` shows it, `lucebox down` stops it")
        return EXIT_OK

    if getattr(args, "prepare_only", False):  # a serve flag; up has none
        pipeline.prepare(paths, _serve_options(args), step_printer())
        return EXIT_OK
    options = servedset.one_from_setting(_serve_options(args), config.load_settings(paths))
    return pipeline.serve(paths, options, step_printer())


def show_launch_plan(paths: Paths, options: ServeOptions, *, as_json: bool) -> int:
    """What `plan` and `up/serve --dry-run` print: the launch plan, then exit 3 if refused."""
    settings = config.load_settings(paths)
    sources = servedset.served_sources(options, settings)
    if sources:
        return setcmd.show_set_plan(paths, options, sources, as_json=as_json)
    options = servedset.one_from_setting(options, settings)
    quiet: Callable[[pipeline.StepEvent], None] = lambda event: None  # noqa: E731
    try:
        prepared = pipeline.prepare(paths, options, quiet, dry_run=True)
        launch_plan, refusal = prepared.launch, None
    except GuardRefusal as exc:
        if not isinstance(exc, PlanRefusal):
            raise
        launch_plan, refusal = exc.launch, exc
    launch_plan = dataclasses.replace(launch_plan, fit_check=fitcheck.fit_check(launch_plan))
    if as_json:
        print_json(launch_plan.to_json())
    else:
        _print_launch_plan(launch_plan)
    if refusal is not None:
        raise refusal
    return EXIT_OK


def _print_launch_plan(launch_plan: LaunchPlan) -> None:
    result = launch_plan.plan
    memory = result.memory_bytes
    print(f"{launch_plan.title} on {launch_plan.budget.device}")
    for problem in launch_plan.problems:
        print(f"  {problem.severity} {problem.code}: {problem.message}")
    for name, value in memory.to_json().items():
        why = result.reasons.get(name, "")
        print(f"  {name:<13}{units.mib_text(value):>12}  {why}")
    print(
        f"  ctx {result.ctx}, KV {result.cache_type_k}/{result.cache_type_v}, "
        f"GPU layers {'all' if result.n_gpu_layers < 0 else result.n_gpu_layers}, "
        f"slots {result.parallel}"
    )
    for key in ("ctx", "cache_type", "n_gpu_layers", "spec", "swa_full", "kvflash_pool"):
        if key in result.reasons:
            print(f"  {key}: {result.reasons[key]}")
    fit = launch_plan.fit_check
    if fit is not None:
        print(
            f"  llama-fit-params: model {fit['model_mib']} MiB, context {fit['context_mib']} MiB,"
            f" compute {fit['compute_mib']} MiB ({fit['difference_percent']:+.1f}% vs plan)"
        )
    print("  command: " + launch_plan.command)


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

    # models.served with one entry names the model, as it does for serve.
    options = servedset.one_from_setting(_serve_options(args), config.load_settings(paths))
    app = make_app(paths, options)
    app.run()
    return EXIT_FAILURE if app.return_code is None else app.return_code


# --- presets and plan -------------------------------------------------------------------------


def cmd_presets(args: argparse.Namespace, paths: Paths) -> int:
    options = _serve_options(args)
    view = pipeline.machine_view(paths, options)
    budget = view.budget
    peers.check_builds(view.peers, view.engine.version)
    table = presetchoice.preset_table(paths, options, view.resolved, budget, view.engine)
    plans, best = table.plans, table.best
    if args.json:
        print_json(
            {
                "budget": {"device": budget.device, "vram_free_bytes": budget.vram_free_bytes},
                "best": best.alias if best else None,
                "presets": [
                    {
                        "id": p.alias,
                        "title": p.title,
                        "vram_tier_gib": p.preset.vram_tier_gib if p.preset else 0,
                        "fits": not p.misfit,
                        "ctx": p.plan.ctx if p.plan.fits else 0,
                        "reason": p.misfit,
                        "spec": p.speculation.spec_type,
                        "engine": p.engine_kind,
                        "smoke_test": bool(p.preset and p.preset.smoke_test),
                        "evidence": p.preset.evidence if p.preset else "",
                    }
                    for p in plans
                ],
            }
        )
        return EXIT_OK
    print(f"{budget.device}: {units.gib_text(budget.vram_free_bytes)} free")
    id_width = max((len(item.alias) for item in plans), default=16)
    for item in plans:
        mark = "*" if best is not None and item is best else " "
        fit = (
            f"fits, {item.plan.ctx:>7,} tokens ({item.plan.cache_type_k} KV)"
            if not item.misfit
            else f"does not fit: {item.misfit}"
        )
        tier = item.preset.vram_tier_gib if item.preset else 0
        print(f"{mark} {item.alias:<{id_width}} {tier:>3} GB  {fit:<36} {item.title}")
    if best is not None:
        print(f"* = what `lucebox up` picks: {best.alias}")
    return EXIT_OK


def cmd_plan(args: argparse.Namespace, paths: Paths) -> int:
    return show_launch_plan(paths, _serve_options(args), as_json=args.json)


# --- parser -----------------------------------------------------------------------------------


def _add_launch_options(parser: argparse.ArgumentParser) -> None:
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


def _add_serve_options(parser: argparse.ArgumentParser) -> None:
    _add_launch_options(parser)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check and plan without downloading or starting anything; print the launch plan",
    )
    add_json(parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lucebox",
        description="Turn this PC into a local LLM appliance: one GPU, one command.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(
        name: str, help_text: str, handler: Handler, parent: Any = commands
    ) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = parent.add_parser(
            name, help=help_text, description=help_text
        )
        sub.set_defaults(handler=handler)
        return sub

    up = command(
        "up",
        "find the GPU, pick models, start and watch the server (TUI)",
        cmd_up,
    )
    _add_serve_options(up)
    up.add_argument("--headless", action="store_true", help="no TUI: same as `lucebox serve`")
    up.add_argument("--detach", action="store_true", help="run in the background")

    serve = command(
        "serve",
        "the whole pipeline headless in the foreground (for systemd)",
        cmd_serve,
    )
    _add_serve_options(serve)
    serve.add_argument("--detach", action="store_true", help="run in the background")
    serve.add_argument(
        "--prepare-only", action="store_true", help="pull models and build the engine, then exit"
    )

    status.add_commands(command)

    doc = command(
        "doctor", "GPU, driver, CUDA toolkit, cmake, compiler, disk, engine, models", cmd_doctor
    )
    add_json(doc)

    presets = command(
        "presets",
        "the presets and which fit this GPU",
        cmd_presets,
    )
    add_json(presets)
    presets.add_argument(
        "--vram-mib", type=mib_list, metavar="N[,N...]", help="plan for cards of N MiB each"
    )
    presets.add_argument("--gpus", type=index_list, metavar="0,1", help="GPUs to plan for")
    presets.add_argument("--rpc", type=peer_list, metavar="HOST:PORT[,...]", help="peers to add")

    plan = command(
        "plan",
        "memory plan for a preset or model, no side effects",
        cmd_plan,
    )
    add_json(plan)
    _add_launch_options(plan)

    models = command(
        "models", "check, download and manage model files", lambda a, p: _print_help(models)
    )
    modelscmd.add_commands(models.add_subparsers(dest="models_command", metavar="COMMAND"), command)

    engine = command(
        "engine", "get, build and choose the inference engine", lambda a, p: _print_help(engine)
    )
    enginecmd.add_commands(engine.add_subparsers(dest="engine_command", metavar="COMMAND"), command)

    svc = command(
        "service", "run lucebox at boot as a systemd service", lambda a, p: _print_help(svc)
    )
    servicecmd.add_commands(svc)

    cfg = command("config", "show or change settings in config.toml", lambda a, p: _print_help(cfg))
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

    bench = command("bench", "measure the running server", lambda a, p: _print_help(bench))
    bench_cmds = bench.add_subparsers(dest="bench_command", metavar="COMMAND")
    add_bench_commands(bench_cmds, command, positive_int)
    add_connect_command(commands, command)
    add_launch_command(commands, command)
    add_worker_command(commands, command, port_number)
    return parser


def _print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


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
