"""The Lucebox engine's known sources: fill ``deps/lucebox`` with the ``server/`` tree of one.

The engine (``dflash_server``, Luce-Org/lucebox, Apache-2.0) is built from a pinned commit, one
of :data:`SOURCES`. On a connected PC its source comes from GitHub's archive of that commit;
offline, from a local tarball of the same tree. GitHub's archives are not byte-stable, so the
pin is a digest of the tree, not of an archive: the sha256 of the text ``sha256sum`` prints for
the tree's regular files (``HEX  server/path`` lines, paths sorted bytewise, each line ending in
a newline), over ``server/`` without the folders and files no build reads (evaluation data,
examples, images, and the Block-Sparse-Attention submodule, an empty folder in GitHub's
archive, pinned on its own by :mod:`lucebox.engine.engines.bsa`). The tree is hashed again
before every build (:func:`check_unpacked`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import httpx

from lucebox.engine.core.errors import HashMismatchError, UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines.known import FlagChange, KnownSource, KnownSources
from lucebox.engine.engines.source import SourceError, SourceInfo, checkout_root
from lucebox.engine.engines.sourcetree import (
    MARKER_NAME,
    check_unchanged,
    hash_tree,
    put_in_place,
    tree_digest,
    unpack_tree,
)

REPO = "Luce-Org/lucebox"
DEFAULT_ARCHIVE_BASE_URL = "https://github.com"
SUBDIR = "server"
EXCLUDED_DIRS = ("server/eval/", "server/examples/", "server/deps/Block-Sparse-Attention/")
EXCLUDED_SUFFIXES = (".png", ".gif")
DOWNLOAD_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class LuceboxPin:
    """The commit the Lucebox engine is built from, and the digest of its server tree."""

    commit: str
    tree_sha256: str
    file_count: int
    date: str

    @property
    def short(self) -> str:
        return self.commit[:8]

    @property
    def identity(self) -> str:
        return f"lucebox:{self.commit} tree-sha256:{self.tree_sha256}"


def known(
    pin: LuceboxPin, adds: tuple[str, ...] = (), flag_changes: tuple[FlagChange, ...] = ()
) -> KnownSource[LuceboxPin]:
    """A commit of the engine as a known source: GitHub's archive of it, checked by its tree."""
    return KnownSource(
        version=pin.short,
        date=pin.date,
        origin=f"https://github.com/{REPO}/tree/{pin.commit}/{SUBDIR}",
        digest=f"tree-sha256:{pin.tree_sha256}",
        identity=pin.identity,
        binary="dflash_server",
        pin=pin,
        adds=adds,
        flag_changes=flag_changes,
    )


SOURCES = KnownSources(
    (
        known(
            LuceboxPin(
                commit="62880e2013fc0b808e9cfbba545a5842b35dc50f",
                tree_sha256="557fdfc479df6dbb693d044690d0cf0f77927802e7436733ec0c7ddf63cff2a9",
                file_count=1470,
                date="2026-07-20",
            ),
        ),
        known(
            LuceboxPin(
                commit="4cf58a04c9f6b7c117a54c09ab1cb004d13175c9",
                tree_sha256="26e459f21c902c2fc6381b7d3cf7473971b709e2e4fe3e16f8262583a5b9f425",
                file_count=1536,
                date="2026-08-11",
            ),
            adds=(
                "tensor parallel for Qwen3.5/3.6 targets over two GPUs (--target-split-mode "
                "tensor with --target-devices), DFlash on such targets",
                "paged attention (--paged-attention)",
                "tool-call parser fixes for malformed calls",
                "a tool-split agent cache",
                "a native Windows build",
            ),
            flag_changes=(
                FlagChange(None, "--target-split-mode"),
                FlagChange(None, "--target-split-fast-rollback"),
                FlagChange(None, "--paged-attention"),
            ),
        ),
    ),
    default_version="4cf58a04",
)
"""The Lucebox engine's known sources, oldest first. A fresh install builds 4cf58a04: on an
H200 it was built by lucebox, passed ``engine update``'s self-test from 62880e20 with a
generated qwen35 target and Lucebox draft, rolled back in 1.1 s, and its plan matched
nvidia-smi after warm-up within 0.1% (benchmarks/results/h200-engine-update-gpu.json)."""

PIN = SOURCES.default.pin
"""The pin a fresh install builds."""


def pin_of(source: SourceInfo) -> LuceboxPin:
    """The known source a fetched Lucebox source is of (its identity names it)."""
    found = SOURCES.by_identity(source.identity)
    if found is None:
        raise UsageError(
            f"{source.path} holds a Lucebox engine source lucebox does not know "
            f"({source.identity})",
            hint="run `lucebox engine source --engine lucebox` to fetch the pinned one",
        )
    return found.pin


ByteProgress = Callable[[int], None]
"""Called with the bytes downloaded so far."""


def archive_url(pin: LuceboxPin = PIN, base_url: str = DEFAULT_ARCHIVE_BASE_URL) -> str:
    """GitHub's archive URL of the pinned commit (``base_url`` stands in for GitHub in tests)."""
    return f"{base_url.rstrip('/')}/{REPO}/archive/{pin.commit}.tar.gz"


def default_source_dir(paths: Paths) -> Path:
    """``deps/lucebox`` in a checkout, beside ``deps/llama.cpp``; the data dir otherwise."""
    root = checkout_root()
    return (root if root is not None else paths.data_dir) / "deps" / "lucebox"


def server_dir(source: SourceInfo) -> Path:
    """The folder cmake configures: ``server/`` of the unpacked tree."""
    return source.path / SUBDIR


def tree_path(name: str) -> str | None:
    """The path of an archive member inside the repo (``server/...``), or None when the tree
    digest leaves it out. GitHub's archive puts everything under ``lucebox-<commit>/``."""
    parts = PurePosixPath(name.lstrip("./")).parts
    if parts and parts[0] != SUBDIR:
        parts = parts[1:]
    if not parts or parts[0] != SUBDIR or ".." in parts:
        return None
    path = "/".join(parts)
    if path.startswith(EXCLUDED_DIRS) or path.endswith(EXCLUDED_SUFFIXES):
        return None
    return path


def read_source(source_dir: Path, pin: LuceboxPin = PIN) -> SourceInfo | None:
    """The unpacked pinned tree in ``source_dir``, or None when it holds another or none."""
    with contextlib.suppress(OSError, ValueError):
        recorded = json.loads((source_dir / MARKER_NAME).read_text(encoding="utf-8"))
        if recorded.get("tree_sha256") == pin.tree_sha256 and (source_dir / SUBDIR).is_dir():
            return SourceInfo(source_dir, "pin", pin.identity, None)
    return None


def check_unpacked(source: SourceInfo) -> None:
    """Refuse to build a tree that changed since it was unpacked (a file edited, added or
    removed under ``server/``): a build is labelled with the pinned identity, so it must be
    the pinned tree. Files the digest leaves out (the BSA submodule, images) may change."""
    pin = pin_of(source)
    try:
        recorded = json.loads((source.path / MARKER_NAME).read_text(encoding="utf-8"))
        files = recorded.get("files") or {}
    except (OSError, ValueError, AttributeError):
        files = {}
    actual = hash_tree(server_dir(source), lambda path: tree_path(f"{SUBDIR}/{path}"))
    check_unchanged(
        source.path,
        actual,
        pin.tree_sha256,
        files if isinstance(files, dict) else {},
        what=f"the Lucebox engine source {pin.short}",
        way_back=f"to build the pinned tree, delete {source.path} and run "
        "`lucebox engine source --engine lucebox` again",
    )


def unpack(archive: Path, staging: Path) -> dict[str, str]:
    """Write the tree's regular files from ``archive`` into ``staging``; their sha256 by path."""
    return unpack_tree(archive, staging, tree_path)


def verify(hashes: dict[str, str], origin: str, pin: LuceboxPin = PIN) -> None:
    """Refuse a tree that is not the pinned one, saying how it differs."""
    if not hashes:
        raise HashMismatchError(
            f"{origin} holds no {SUBDIR}/ folder of the Lucebox engine",
            hint=f"use GitHub's archive of {REPO} at commit {pin.commit}",
        )
    actual = tree_digest(hashes)
    if actual != pin.tree_sha256:
        raise HashMismatchError(
            f"the Lucebox engine source from {origin} is not the pinned tree: its digest is "
            f"{actual} over {len(hashes)} files, lucebox pins {pin.tree_sha256} over "
            f"{pin.file_count} files (commit {pin.commit})",
            hint="the archive is corrupt or of another commit: fetch the pinned one again",
        )


def download(
    url: str,
    dest: Path,
    client: httpx.Client,
    on_progress: ByteProgress | None = None,
    *,
    offline_flag: str = "--tarball",
) -> Path:
    """Stream ``url`` to ``dest`` (written whole or not at all); a failure's hint names
    ``offline_flag``, the flag that gives a local copy instead."""
    part = dest.with_name(dest.name + ".part")
    try:
        with client.stream("GET", url) as response:
            if response.status_code != 200:
                raise SourceError(
                    f"{url} answered HTTP {response.status_code}",
                    hint=f"check the network, or pass {offline_flag} PATH with a local copy",
                )
            done = 0
            with part.open("wb") as out:
                for chunk in response.iter_bytes(1 << 20):
                    out.write(chunk)
                    done += len(chunk)
                    if on_progress is not None:
                        on_progress(done)
    except httpx.HTTPError as exc:
        part.unlink(missing_ok=True)
        raise SourceError(
            f"cannot download {url}: {exc}",
            hint=f"check the network, or pass {offline_flag} PATH with a local copy",
        ) from exc
    part.replace(dest)
    return dest


def ensure_source(
    paths: Paths,
    *,
    source_dir: Path | None = None,
    tarball: Path | None = None,
    base_url: str | None = None,
    client: httpx.Client | None = None,
    on_progress: ByteProgress | None = None,
    pin: LuceboxPin = PIN,
) -> SourceInfo:
    """Make ``source_dir`` (default ``deps/lucebox``) hold the pinned tree, verified."""
    target = source_dir if source_dir is not None else default_source_dir(paths)
    existing = read_source(target, pin)
    if existing is not None:
        return existing
    if target.exists() and not target.is_dir():
        raise UsageError(f"{target} is a file, not the Lucebox engine source folder")
    if target.is_dir() and any(target.iterdir()) and not (target / MARKER_NAME).exists():
        raise UsageError(
            f"{target} holds files that are not the pinned Lucebox engine source",
            hint="move them away so lucebox can fill the folder",
        )
    if tarball is not None:
        if not tarball.is_file():
            raise UsageError(f"{tarball} does not exist", hint="give the path of the tarball")
        archive, origin = tarball, str(tarball)
    else:
        url = archive_url(pin, base_url or DEFAULT_ARCHIVE_BASE_URL)
        dest = paths.ensure(paths.downloads_dir) / f"lucebox-{pin.commit}.tar.gz"
        http = client or httpx.Client(timeout=DOWNLOAD_TIMEOUT_S, follow_redirects=True)
        try:
            archive = download(url, dest, http, on_progress)
        finally:
            if client is None:
                http.close()
        origin = url

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.staging-{os.getpid()}"
    old = target.parent / f".{target.name}.old-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir()
        hashes = unpack(archive, staging)
        verify(hashes, origin, pin)
        marker = {
            "repo": REPO,
            "commit": pin.commit,
            "tree_sha256": pin.tree_sha256,
            "files": hashes,  # names the files that differ when a build finds the tree changed
        }
        put_in_place(staging, target, old, marker)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
        if tarball is None:
            archive.unlink(missing_ok=True)
    return SourceInfo(target, "pin", pin.identity, None)
