"""``lucebox engine source|build --engine lucebox``: the Lucebox engine's source and build."""

from __future__ import annotations

import argparse
from pathlib import Path

from lucebox.app.cliargs import print_json
from lucebox.app.progress import bytes_progress
from lucebox.engine.core.errors import EXIT_OK, UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import lucebox


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
        paths,
        tarball=args.tarball,
        base_url=args.base_url,
        on_progress=bytes_progress("Lucebox engine source"),
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
