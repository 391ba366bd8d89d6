"""Block-Sparse-Attention: PFlash's fast kernel, an optional part of the Lucebox engine source.

The engine's CMake builds BSA from ``server/deps/Block-Sparse-Attention`` (a git submodule,
empty in GitHub's archive of the engine) and needs two folders of it:
``csrc/block_sparse_attn/src`` and the CUTLASS headers BSA itself pins as a submodule,
``csrc/cutlass/include``. lucebox pins those folders (and both licences) by one tree digest, by
the rule of :mod:`lucebox.engine.engines.sourcetree` over paths ``Block-Sparse-Attention/...``:
on a connected PC they come from GitHub's archives of the two commits, offline from a local
tarball of the same tree. Without them, or for a card older than sm_80, the engine builds
without BSA and PFlash runs its slow fallback.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import httpx

from lucebox.engine.core.errors import FetchError, HashMismatchError, UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines import lucebox
from lucebox.engine.engines.lucebox import ByteProgress
from lucebox.engine.engines.source import SourceInfo
from lucebox.engine.engines.sourcetree import (
    MARKER_NAME,
    check_unchanged,
    hash_tree,
    put_in_place,
    tree_digest,
    unpack_tree,
)

TOP = "Block-Sparse-Attention"
"""The folder the tree is laid out under, and its name in ``server/deps``."""
KEPT = (
    f"{TOP}/LICENSE",
    f"{TOP}/csrc/block_sparse_attn/src/",
    f"{TOP}/csrc/cutlass/LICENSE.txt",
    f"{TOP}/csrc/cutlass/include/",
)
"""What the tree holds: the two folders the engine's CMake reads, and both licences."""
MIN_ARCH = 80
"""BSA's kernels need sm_80 or newer."""
SLOW_FALLBACK = "no BSA: PFlash runs the slow fallback"
OFFLINE_FLAG = "--bsa-tarball"
CONNECT_TIMEOUT_S = 10.0
"""A PC with no network learns it at the first archive, within this, and builds without BSA."""


@dataclass(frozen=True)
class BsaPin:
    """The BSA commit, the CUTLASS commit it pins, and the digest of the tree lucebox keeps."""

    repo: str
    commit: str
    cutlass_repo: str
    cutlass_commit: str
    tree_sha256: str
    file_count: int

    @property
    def identity(self) -> str:
        return (
            f"block-sparse-attention:{self.commit} cutlass:{self.cutlass_commit} "
            f"tree-sha256:{self.tree_sha256}"
        )

    @property
    def label(self) -> str:
        return f"Block-Sparse-Attention {self.commit[:8]} with CUTLASS {self.cutlass_commit[:8]}"


PIN = BsaPin(
    repo="mit-han-lab/Block-Sparse-Attention",
    commit="49d6c39e4dc0303442cda3bb758b3925d4399c49",
    cutlass_repo="NVIDIA/cutlass",
    cutlass_commit="a75b4ac483166189a45290783cb0a18af5ff0ea5",
    tree_sha256="9b1be80c72ad5d670bd793db4fd33faebcd8e62142b83908b848ce69a2dbf196",
    file_count=636,
)
"""Both engine sources lucebox knows (62880e20, 4cf58a04) pin this submodule commit."""


@dataclass(frozen=True)
class BsaState:
    """Whether an engine source holds the pinned BSA tree, and what a user reads about it."""

    present: bool
    detail: str


def kept(path: str) -> str | None:
    """``path`` (``Block-Sparse-Attention/...``) when the tree keeps it, else None."""
    parts = PurePosixPath(path).parts
    if ".." in parts or not any(
        path == k or (k.endswith("/") and path.startswith(k)) for k in KEPT
    ):
        return None
    return path


def tarball_path(name: str) -> str | None:
    """A member of a local tarball laid out as ``Block-Sparse-Attention/...``."""
    return kept(name.removeprefix("./"))


def bsa_archive_path(name: str) -> str | None:
    """A member of GitHub's archive of BSA (``Block-Sparse-Attention-<commit>/...``)."""
    parts = PurePosixPath(name).parts
    return kept("/".join((TOP, *parts[1:]))) if len(parts) > 1 else None


def cutlass_archive_path(name: str) -> str | None:
    """A member of GitHub's archive of CUTLASS (``cutlass-<commit>/...``), which BSA holds
    as ``csrc/cutlass``."""
    parts = PurePosixPath(name).parts
    return kept("/".join((TOP, "csrc", "cutlass", *parts[1:]))) if len(parts) > 1 else None


def archive_urls(pin: BsaPin = PIN, base_url: str = lucebox.DEFAULT_ARCHIVE_BASE_URL) -> list[str]:
    """GitHub's archives of BSA and of CUTLASS at the pinned commits (BSA's own archive has
    no CUTLASS: submodules are not in GitHub's archives)."""
    base = base_url.rstrip("/")
    return [
        f"{base}/{pin.repo}/archive/{pin.commit}.tar.gz",
        f"{base}/{pin.cutlass_repo}/archive/{pin.cutlass_commit}.tar.gz",
    ]


def folder(source: SourceInfo) -> Path:
    """Where the engine's CMake looks for BSA in an engine source."""
    return lucebox.server_dir(source) / "deps" / TOP


def arch_supports(arch: str) -> bool:
    """Whether a CUDA arch (``86``, ``90a``, ``120``) is sm_80 or newer."""
    number = re.match(r"\d+", arch)
    return number is not None and int(number.group()) >= MIN_ARCH


def verify(hashes: dict[str, str], origin: str, pin: BsaPin = PIN) -> None:
    """Refuse a tree that is not the pinned one, saying how it differs."""
    actual = tree_digest(hashes)
    if actual != pin.tree_sha256:
        raise HashMismatchError(
            f"the Block-Sparse-Attention source from {origin} is not the pinned tree: its "
            f"digest is {actual} over {len(hashes)} files, lucebox pins {pin.tree_sha256} over "
            f"{pin.file_count} files ({pin.label})",
            hint="the archive is corrupt or of other commits: use the pinned one, or leave "
            f"{OFFLINE_FLAG} out to build without BSA",
        )


def _holds_files(where: Path) -> bool:
    return where.is_dir() and any(where.iterdir())


def _marked(where: Path, pin: BsaPin) -> bool:
    """Whether lucebox unpacked the pinned tree in ``where`` (its marker says so)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        recorded = json.loads((where / MARKER_NAME).read_text(encoding="utf-8"))
        return bool(recorded.get("tree_sha256") == pin.tree_sha256)
    return False


def check_unpacked(source: SourceInfo, pin: BsaPin = PIN) -> BsaState:
    """Whether ``source`` holds the pinned BSA tree, hashed again now. No folder (or an empty
    one, as GitHub's archive of the engine leaves it) is no BSA; a tree whose kept files
    changed since it was unpacked is refused, as the engine's own tree is (files the tree
    does not keep, such as the rest of a git submodule, are not read)."""
    where = folder(source)
    if not _holds_files(where):
        return BsaState(False, f"{SLOW_FALLBACK} (its source is not in {where.parent})")
    try:
        recorded = json.loads((where / MARKER_NAME).read_text(encoding="utf-8"))
        files = recorded.get("files") or {}
    except (OSError, ValueError, AttributeError):
        files = {}
    actual = hash_tree(where, lambda path: kept(f"{TOP}/{path}"))
    check_unchanged(
        where,
        actual,
        pin.tree_sha256,
        files if isinstance(files, dict) else {},
        what=f"the {pin.label} source",
        way_back=f"delete {where} and run `lucebox engine source --engine lucebox` again "
        f"(offline with {OFFLINE_FLAG} PATH)",
    )
    return BsaState(True, f"{pin.label}, checked")


def ensure(
    paths: Paths,
    source: SourceInfo,
    *,
    tarball: Path | None = None,
    base_url: str | None = None,
    client: httpx.Client | None = None,
    on_progress: ByteProgress | None = None,
    online: bool = True,
    pin: BsaPin = PIN,
) -> BsaState:
    """Make the engine ``source`` hold the pinned BSA tree: from ``tarball``, else (when
    ``online``) from GitHub's archives. A tree that is not the pinned one is refused; a
    download that fails leaves the source without BSA and says so."""
    where = folder(source)
    if tarball is None:
        if _marked(where, pin):
            return BsaState(True, f"{pin.label}")
        if _holds_files(where) or not online:
            return check_unpacked(source, pin)  # a checkout's submodule is used if pinned
    elif not tarball.is_file():
        raise UsageError(f"{tarball} does not exist", hint="give the path of the BSA tarball")
    elif _holds_files(where) and not (where / MARKER_NAME).exists():
        raise UsageError(
            f"{where} holds files lucebox did not unpack",
            hint=f"move them away so lucebox can put the pinned tree there, or leave out "
            f"{OFFLINE_FLAG}",
        )
    where.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{TOP}.staging-", dir=where.parent))
    old = where.parent / f".{TOP}.old-{os.getpid()}"
    try:
        if tarball is not None:
            hashes, origin = unpack_tree(tarball, staging, tarball_path), str(tarball)
        else:
            try:
                hashes = _fetch(paths, staging, base_url, client, on_progress, pin)
            except FetchError as exc:
                return BsaState(False, f"{SLOW_FALLBACK} ({exc.message})")
            origin = " and ".join(archive_urls(pin, base_url or lucebox.DEFAULT_ARCHIVE_BASE_URL))
        verify(hashes, origin, pin)
        marker = {
            "repo": pin.repo,
            "commit": pin.commit,
            "cutlass_commit": pin.cutlass_commit,
            "tree_sha256": pin.tree_sha256,
            "files": hashes,
        }
        put_in_place(staging / TOP, where, old, marker)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return BsaState(True, f"{pin.label}, checked")


def _fetch(
    paths: Paths,
    staging: Path,
    base_url: str | None,
    client: httpx.Client | None,
    on_progress: ByteProgress | None,
    pin: BsaPin,
) -> dict[str, str]:
    """Both archives downloaded and the kept folders of each unpacked into ``staging``."""
    urls = archive_urls(pin, base_url or lucebox.DEFAULT_ARCHIVE_BASE_URL)
    maps = (bsa_archive_path, cutlass_archive_path)
    names = (f"bsa-{pin.commit}.tar.gz", f"cutlass-{pin.cutlass_commit}.tar.gz")
    timeout = httpx.Timeout(lucebox.DOWNLOAD_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    http = client or httpx.Client(timeout=timeout, follow_redirects=True)
    hashes: dict[str, str] = {}
    try:
        for url, tree_path, name in zip(urls, maps, names, strict=True):
            dest = paths.ensure(paths.downloads_dir) / name
            try:
                archive = lucebox.download(url, dest, http, on_progress, offline_flag=OFFLINE_FLAG)
                hashes.update(unpack_tree(archive, staging, tree_path))
            finally:
                dest.unlink(missing_ok=True)
    finally:
        if client is None:
            http.close()
    return hashes
