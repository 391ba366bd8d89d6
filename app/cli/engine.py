"""``lucebox engine``: get an engine kind's pinned source, build, list, fetch or add engines."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from lucebox.app.cli.args import add_json, print_json
from lucebox.app.cli.handler import Command, group_help
from lucebox.app.cli.progress import StderrProgress, bytes_progress, transfer_progress
from lucebox.engine.bench import selftest
from lucebox.engine.core.errors import EXIT_OK, GuardRefusal, UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import (
    bsa,
    build,
    cputarget,
    install,
    kinds,
    registry,
    toolchain,
    update,
)
from lucebox.engine.engines.known import KnownSource
from lucebox.engine.machine import config, cpu, gpu
from lucebox.engine.plan.flagtypes import positive_int
from lucebox.engine.plan.options import ServeOptions
from lucebox.engine.run.runstate import current_status


def cmd_engine_source(args: argparse.Namespace, paths: Paths) -> int:
    kind = kinds.kind(args.engine)
    _refuse_other_kinds_flags(args, kind)
    info = kind.ensure_source(
        paths,
        bytes_progress(f"{kind.name} source"),
        archive=getattr(args, _dest(kind.source_flags.archive)),
        index=getattr(args, _dest(kind.source_flags.index)),
        known=_known_source(kind, args.version),
        part_archive=_part_archive(args, kind),
    )
    kind.check_source(info)
    if args.json:
        print_json(kind.source_document(info))
    else:
        how = "pinned" if info.origin == "pin" else "existing checkout, used as is"
        print(f"{kind.title} source: {info.path} ({how})\n  identity: {info.identity}")
        for note in kind.source_notes(info):
            print(f"  {note}")
    return EXIT_OK


def cmd_engine_build(args: argparse.Namespace, paths: Paths) -> int:
    kind = kinds.kind(args.engine)
    known = _known_source(kind, args.version)
    want: build.Backend | None = "cpu" if args.cpu else "cuda" if args.cuda else None
    archs = build.parse_archs(args.arch) if args.arch else ()
    choice = kind.choose_build(
        gpu.probe_gpus(), toolchain.probe_cuda_toolkit(), want=want, archs=archs
    )
    if args.cpu_target is not None:  # a build for other PCs (the image) names its baseline
        target = cputarget.named(args.cpu_target).name
        options = dataclasses.replace(choice.options, cpu_target=target)
        choice = build.BuildChoice(options, f"{choice.reason}; CPU code for {target} as asked")
    print(f"engine build ({kind.name}): {choice.reason}", file=sys.stderr)
    src = kind.ensure_source(paths, bytes_progress(f"{kind.name} source"), known=known)
    bar = StderrProgress(f"{kind.name} build")
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
        manifest, cached = kind.build_and_install(
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
        if kinds.kind(manifest.kind).serves_pflash:
            print(f"  PFlash: {_pflash_line(manifest)}")
    return EXIT_OK


def _webui_line(engine: registry.EngineManifest) -> str:
    answer = "yes" if engine.webui else "no"
    return f"{answer} ({engine.webui_detail})" if engine.webui_detail else answer


def cmd_engine_status(args: argparse.Namespace, paths: Paths) -> int:
    settings = config.load_settings(paths)
    host_cpu = cpu.probe_cpu()
    probe = gpu.probe_gpus()
    chosen = {
        name: kind.select(paths, probe, settings.engine_id, host_cpu)
        for name, kind in kinds.KINDS.items()
    }
    selection = chosen[kinds.LLAMA_SERVER.name]
    in_use = {s.engine.id for s in chosen.values() if s.engine is not None}
    engines = registry.list_engines(paths)
    fits = {e.id: registry.cpu_fit(paths, e, host_cpu) for e in engines}
    if args.json:
        print_json(
            {
                "selected": selection.engine.id if selection.engine else None,
                "reason": selection.reason,
                "selected_per_kind": {
                    name: {"id": s.engine.id if s.engine else None, "reason": s.reason}
                    for name, s in chosen.items()
                },
                "cpu": {"arch": host_cpu.arch, "model": host_cpu.model_name},
                "engines": [
                    {
                        **e.to_json(),
                        "cpu": fits[e.id].to_json(),
                        "built_from": _built_from_json(e),
                        "in_use": e.id in in_use,
                        "bsa": _bsa(e),
                    }
                    for e in engines
                ],
            }
        )
        return EXIT_OK
    if not engines:
        print("no engine installed: run `lucebox engine build`")
        return EXIT_OK
    for engine in engines:
        mark = "*" if engine.id in in_use else " "
        archs = f" sm_{','.join(engine.cuda_archs)}" if engine.cuda_archs else ""
        print(f"{mark} {engine.id}  {engine.kind}  {engine.backend}{archs}  {engine.version}")
        print(f"    built from: {_built_from_line(engine)}")
        print(f"    spec types: {', '.join(engine.capabilities.spec_types)}")
        if kinds.kind(engine.kind).serves_pflash:
            print(f"    PFlash: {_pflash_line(engine)}")
        if engine.toolkit:
            print(f"    built with: {engine.toolkit}")
        print(f"    web UI: {_webui_line(engine)}; RPC: {'yes' if engine.rpc else 'no'}")
        fit = fits[engine.id]
        fix = "; rebuild it for this CPU: `lucebox engine build`" if fit.runs is False else ""
        print(f"    CPU: {fit.detail}{fix}")
    print(f"using: {selection.engine.id if selection.engine else 'none'} ({selection.reason})")
    installed_kinds = {e.kind for e in engines}
    for name, choice in chosen.items():
        if name in installed_kinds and choice is not selection:
            used = choice.engine.id if choice.engine else "none"
            print(f"using for {kinds.kind(name).title}: {used} ({choice.reason})")
    return EXIT_OK


def _bsa(engine: registry.EngineManifest) -> bool | None:
    """Whether a build has PFlash's fast kernel, Block-Sparse-Attention (None for kinds
    without PFlash)."""
    return bool(engine.options.get("bsa")) if kinds.kind(engine.kind).serves_pflash else None


def _pflash_line(engine: registry.EngineManifest) -> str:
    if _bsa(engine):
        return "fast kernel (Block-Sparse-Attention)"
    return str(engine.options.get("bsa_note") or bsa.SLOW_FALLBACK)


def _built_from_json(engine: registry.EngineManifest) -> dict[str, Any] | None:
    known = kinds.built_from(engine)
    if known is None:
        return None
    default = kinds.kind(engine.kind).known.default
    return {**known.to_json(), "default": known is default}


def _built_from_line(engine: registry.EngineManifest) -> str:
    known = kinds.built_from(engine)
    if known is not None:
        table = kinds.kind(engine.kind).known
        which = "the default source" if known is table.default else "a known source"
        if known is table.newest and known is not table.default:
            which = "the newest known source, not yet the default"
        return f"{known.version} ({known.date}), {which}"
    if engine.origin != "build":
        return f"not built by lucebox ({engine.origin})"
    return f"a source lucebox does not pin ({engine.source_identity})"


def cmd_engine_path(args: argparse.Namespace, paths: Paths) -> int:
    settings = config.load_settings(paths)
    selection = registry.select_engine(paths, gpu.probe_gpus(), settings.engine_id)
    if selection.engine is None:
        raise registry.EngineError(selection.reason)
    print(selection.engine.server_path)
    return EXIT_OK


def cmd_engine_fetch(args: argparse.Namespace, paths: Paths) -> int:
    manifest = install.fetch_engine(
        paths, args.url, args.sha256, on_progress=transfer_progress("engine fetch")
    )
    print(f"{manifest.id}: installed from {args.url}\n  {manifest.server_path}")
    return EXIT_OK


def cmd_engine_add(args: argparse.Namespace, paths: Paths) -> int:
    manifest = install.add_engine(paths, args.path, args.source)
    print(f"{manifest.id}: registered {manifest.server_path}\n  {manifest.version}")
    return EXIT_OK


def cmd_engine_update(args: argparse.Namespace, paths: Paths) -> int:
    kind = kinds.kind(args.engine)
    running = current_status(paths)
    if running.state != "stopped":
        raise UsageError(
            f"lucebox serves {running.model} at {running.url}: the self-test needs the memory "
            "that server holds",
            hint="stop it with `lucebox down`, update, then start it again: the new build "
            "serves from that start",
        )
    current = kind.select(paths, gpu.probe_gpus(), config.load_settings(paths).engine_id).engine
    if current is None:
        raise UsageError(
            f"no build of {kind.title} to update from", hint=f"run `{kind.build_command}`"
        )
    candidate = _candidate(args, paths, kind, current)
    if candidate.id == current.id:
        if args.json:
            print_json({"current": current.id, "candidate": candidate.id, "switched": False})
        else:
            print(f"{current.id} serves already: it is built from the newest known source")
        return EXIT_OK
    options = ServeOptions(
        model=args.model,
        draft=args.draft,
        preset=args.preset,
        ctx=args.ctx,
        # The Lucebox engine's builds are self-tested on that engine, whatever the planner's
        # own choice for the model would be.
        engine="lucebox" if kind is kinds.LUCEBOX else None,
    )
    result = selftest.run_self_test(
        paths,
        options,
        current.id,
        candidate.id,
        on_note=lambda note: print(f"engine update: {note}", file=sys.stderr),
    )
    failed = result.failed
    if args.json:
        print_json({**result.to_json(), "switched": failed is None})
    else:
        for probe in result.probes:
            print(f"  {'ok  ' if probe.passed else 'FAIL'} {probe.name}: {probe.detail}")
    if failed is not None:
        raise GuardRefusal(
            f"{candidate.id} failed its self-test at the {failed.name} probe ({failed.detail}): "
            f"{current.id} stays the active build",
            hint="`lucebox engine status` lists the builds; `lucebox doctor` checks this PC",
        )
    update.activate(paths, kind.name, current.id, candidate.id)
    if not args.json:
        print(
            f"switched {kind.title} from {current.id} to {candidate.id} (engine.id); it serves "
            "from the next start of lucebox; `lucebox engine rollback` goes back"
        )
    return EXIT_OK


def _candidate(
    args: argparse.Namespace,
    paths: Paths,
    kind: kinds.EngineKind,
    current: registry.EngineManifest,
) -> registry.EngineManifest:
    """The build ``--to`` names, or the newest known source built beside the current one."""
    if args.to:
        named = update.installed(paths, args.to)
        if named is None or named.kind != kind.name:
            raise UsageError(
                f"{args.to} is not an installed build of {kind.title}",
                hint="`lucebox engine status` lists the installed builds",
            )
        return named
    newest = kind.known.newest
    if kinds.built_from(current) is newest:
        return current
    options = current.build_options(current.cpu_target or cputarget.NATIVE)
    built = update.installed_build_of(paths, kind.name, newest, options)
    if built is not None:
        print(f"engine update: {built.id} is built from {newest.version} already", file=sys.stderr)
        return built
    print(f"engine update: building {kind.title} {newest.version} ({newest.date})", file=sys.stderr)
    source = kind.ensure_source(paths, bytes_progress(f"{kind.name} source"), known=newest)
    bar = StderrProgress(f"{kind.name} build")
    try:
        engine, _ = kind.build_and_install(
            paths, source, options, on_event=lambda e: bar.update(e.percent, e.line)
        )
    finally:
        bar.done()
    return engine


def cmd_engine_rollback(args: argparse.Namespace, paths: Paths) -> int:
    state = update.rollback(paths)
    if args.json:
        print_json({"from": state.previous_id, "to": state.current_id, "kind": state.kind})
    else:
        print(
            f"rolled back from {state.previous_id} to {state.current_id} (engine.id; nothing "
            "rebuilt); it serves from the next start of lucebox"
        )
    return EXIT_OK


def register(commands: Any, command: Command) -> None:
    """``lucebox engine`` and its subcommands."""
    engine: argparse.ArgumentParser = command(
        "engine",
        "get, build and choose the inference engine",
        lambda a, p: group_help(engine),
        commands,
    )
    subs = engine.add_subparsers(dest="engine_command", metavar="COMMAND")
    src = command("source", "fetch and check an engine's pinned source", cmd_engine_source, subs)
    _add_source_arguments(src)
    add_json(src)
    build_cmd = command("build", "build an engine for this machine", cmd_engine_build, subs)
    backend = build_cmd.add_mutually_exclusive_group()
    backend.add_argument("--cpu", action="store_true", help="build for the CPU only")
    backend.add_argument("--cuda", action="store_true", help="build for NVIDIA GPUs")
    build_cmd.add_argument("--arch", metavar="86,89", help="CUDA architectures to build for")
    build_cmd.add_argument("--jobs", type=positive_int, metavar="N", help="parallel compile jobs")
    build_cmd.add_argument(
        "--cpu-target",
        metavar="NAME",
        help="the CPU baseline to compile for, for a build other PCs run: "
        f"{', '.join(cputarget.TARGETS)} (default: the fastest this CPU runs)",
    )
    _add_engine_argument(build_cmd)
    _add_version_argument(build_cmd)
    add_json(build_cmd)
    engine_status = command(
        "status", "installed engines and which one is used", cmd_engine_status, subs
    )
    add_json(engine_status)
    command(
        "path",
        "print the path of the llama-server that will be used",
        cmd_engine_path,
        subs,
    )
    fetch = command("fetch", "install a prebuilt engine tarball", cmd_engine_fetch, subs)
    fetch.add_argument("url", metavar="URL")
    fetch.add_argument("--sha256", required=True, metavar="HEX", help="the tarball's sha256")
    update_cmd = command(
        "update",
        "build the newest known source, self-test it on this PC, then make it the active build",
        cmd_engine_update,
        subs,
    )
    _add_engine_argument(update_cmd)
    update_cmd.add_argument(
        "--to",
        metavar="ID",
        help="self-test and switch to this installed build instead of building one",
    )
    update_cmd.add_argument("--model", metavar="SRC", help="the model to self-test with")
    update_cmd.add_argument("--draft", metavar="SRC", help="the draft of --model to self-test with")
    update_cmd.add_argument("--preset", metavar="ID", help="the preset to self-test with")
    update_cmd.add_argument("--ctx", type=positive_int, metavar="N", help="context length")
    add_json(update_cmd)
    rollback = command(
        "rollback", "go back to the build the last update replaced", cmd_engine_rollback, subs
    )
    add_json(rollback)
    add = command("add", "register a llama-server you already have", cmd_engine_add, subs)
    add.add_argument("path", metavar="PATH", type=Path)
    add.add_argument(
        "--source",
        metavar="DIR",
        type=Path,
        help="its llama.cpp source, to read the model architectures it knows",
    )


# --- per-kind source flags ------------------------------------------------------------------


def _add_engine_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine",
        choices=tuple(kinds.KINDS),
        default=kinds.LLAMA_SERVER.name,
        help="which engine (default: llama-server; lucebox: the Lucebox engine, CUDA only)",
    )


def _add_version_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--version",
        metavar="VERSION",
        help="which known source of the engine (default: the one a fresh install builds; "
        "`lucebox engine status --json` lists them)",
    )


def _known_source(kind: kinds.EngineKind, version: str | None) -> KnownSource[Any] | None:
    """The known source ``--version`` names; None: the kind's default."""
    if version is None:
        return None
    found = kind.known.by_version(version)
    if found is None:
        versions = ", ".join(s.version for s in kind.known.sources)
        raise UsageError(
            f"{version} is not a known source of {kind.title}",
            hint=f"known versions: {versions}",
        )
    return found


def _add_source_arguments(parser: argparse.ArgumentParser) -> None:
    _add_engine_argument(parser)
    _add_version_argument(parser)
    for kind in kinds.KINDS.values():
        flags = kind.source_flags
        where = f"--engine {kind.name}: "
        parser.add_argument(
            flags.archive, metavar="PATH", type=Path, help=where + flags.archive_help
        )
        parser.add_argument(flags.index, metavar="URL", help=where + flags.index_help)
        if flags.part_archive:
            parser.add_argument(
                flags.part_archive, metavar="PATH", type=Path, help=where + flags.part_archive_help
            )


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def _part_archive(args: argparse.Namespace, kind: kinds.EngineKind) -> Path | None:
    flag = kind.source_flags.part_archive
    return getattr(args, _dest(flag)) if flag else None


def _refuse_other_kinds_flags(args: argparse.Namespace, kind: kinds.EngineKind) -> None:
    """Each kind's source flags name that kind's source only."""
    for other in kinds.KINDS.values():
        if other is kind:
            continue
        flags = other.source_flags
        for flag in (flags.archive, flags.index, flags.part_archive):
            if flag and getattr(args, _dest(flag), None) is not None:
                raise UsageError(
                    f"{flag} does not apply to --engine {kind.name}", hint=f"leave out {flag}"
                )
