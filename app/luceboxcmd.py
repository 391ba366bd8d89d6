"""``lucebox engine source|build --engine lucebox``: the Lucebox engine's source and build."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from lucebox.app.cliargs import print_json
from lucebox.app.progress import StderrProgress
from lucebox.engine.core.errors import EXIT_OK, UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import build, lucebox, luceboxbuild, toolchain
from lucebox.engine.machine import gpu

MIB = 1024 * 1024


def add_engine_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine",
        choices=("llama-server", "lucebox"),
        default="llama-server",
        help="which engine (default: llama-server; lucebox: the Lucebox engine, CUDA only)",
    )


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_argument(parser)
    parser.add_argument(
        "--tarball",
        metavar="PATH",
        type=Path,
        help="--engine lucebox: a local archive of the pinned commit (offline)",
    )
    parser.add_argument(
        "--base-url",
        metavar="URL",
        help="--engine lucebox: where GitHub's archives are (default: https://github.com)",
    )


def refuse_other_engines_flags(args: argparse.Namespace) -> None:
    """--sdist and --index-url name llama.cpp's source; --tarball and --base-url Lucebox's."""
    lucebox_flags = {"sdist": "--sdist", "index_url": "--index-url"}
    llama_flags = {"tarball": "--tarball", "base_url": "--base-url"}
    for attr, flag in (lucebox_flags if args.engine == "lucebox" else llama_flags).items():
        if getattr(args, attr, None) is not None:
            raise UsageError(
                f"{flag} does not apply to --engine {args.engine}", hint=f"leave out {flag}"
            )


def fetch_source(args: argparse.Namespace, paths: Paths) -> int:
    info = lucebox.ensure_source(
        paths, tarball=args.tarball, base_url=args.base_url, on_progress=_download_progress()
    )
    result = {
        "engine": "lucebox",
        "path": str(info.path),
        "origin": info.origin,
        "identity": info.identity,
        "commit": lucebox.PIN.commit,
        "tree_sha256": lucebox.PIN.tree_sha256,
    }
    if args.json:
        print_json(result)
    else:
        print(f"Lucebox engine source: {info.path}\n  identity: {info.identity}")
    return EXIT_OK


def _download_progress() -> lucebox.ByteProgress:
    bar = StderrProgress("Lucebox engine source")
    shown = [0]

    def report(done_bytes: int) -> None:
        if done_bytes - shown[0] >= 4 * MIB:
            shown[0] = done_bytes
            bar.note(f"{done_bytes / MIB:.0f} MiB downloaded")

    return report


def build_engine(args: argparse.Namespace, paths: Paths) -> int:
    if args.cpu or args.cuda:
        raise UsageError(
            "the Lucebox engine is CUDA only: --cpu and --cuda do not apply",
            hint="leave them out; --arch names the card",
        )
    choice = luceboxbuild.choose_options(
        gpu.probe_gpus(), toolchain.probe_cuda_toolkit(), arch=args.arch
    )
    print(f"engine build (lucebox): {choice.reason}", file=sys.stderr)
    src = lucebox.ensure_source(paths, on_progress=_download_progress())
    bar = StderrProgress("Lucebox engine build")
    started_s = time.monotonic()

    def on_event(event: build.BuildEvent) -> None:
        if event.stage == "configure" and bar.last_percent < 0:
            bar.update(0, "configuring")
        elif event.percent is not None:
            left_s = build.estimate_left_s(time.monotonic() - started_s, event.percent)
            bar.update(event.percent, f"about {left_s / 60:.0f} min left" if left_s else "")

    try:
        manifest, cached = luceboxbuild.build_and_install(
            paths, src, choice.options, jobs=args.jobs, on_event=on_event
        )
    finally:
        bar.done()
    elapsed_s = time.monotonic() - started_s
    if args.json:
        print_json({**manifest.to_json(), "cached": cached, "elapsed_s": round(elapsed_s, 1)})
    else:
        how = "already built" if cached else f"built in {elapsed_s:.0f} s"
        print(f"{manifest.id}: {how}\n  {manifest.server_path}\n  {manifest.version}")
    return EXIT_OK
