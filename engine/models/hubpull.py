"""The Hub pull: one GGUF (and its shards) from the Hugging Face Hub into the store, verified.

huggingface-hub (which honours ``HF_TOKEN``, ``HF_ENDPOINT`` and ``HF_HUB_OFFLINE``) resolves
URLs, metadata, the LFS sha256 and errors; the bytes go through
:mod:`lucebox.engine.core.download` because this huggingface-hub deletes its partial file on any
failure, and a home user's 20 GB download must survive a Ctrl-C or a dropped link. Files already
in the Hugging Face cache, LM Studio or Ollama are used where they are.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import replace
from pathlib import Path

from lucebox.engine.core.download import RetryPolicy, download_file
from lucebox.engine.core.downloadprogress import ProgressCallback
from lucebox.engine.core.errors import (
    GuardRefusal,
    HashMismatchError,
    TransferError,
    TransferRefusedError,
)
from lucebox.engine.core.hashing import sha256_file
from lucebox.engine.core.paths import Paths
from lucebox.engine.models import ondisk
from lucebox.engine.models.guard import shard_names
from lucebox.engine.models.modelsource import ModelSource
from lucebox.engine.models.pullcheck import check_and_record, check_free_disk, checked_record
from lucebox.engine.models.records import ModelRecord, StoreError, repo_dir

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def hub_error(exc: Exception, source: ModelSource) -> StoreError:
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


def pull_hf(
    paths: Paths,
    source: ModelSource,
    on_progress: ProgressCallback | None,
    cancel: threading.Event | None,
    policy: RetryPolicy,
) -> ModelRecord:
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
        return check_and_record(paths, source, files, "hf-cache-blob", source.revision)
    if hub_offline():
        raise hub_error(_offline_error(), source)

    commit, plans = _remote_plans(source, repo_dir(paths, source.repo_id))
    in_place = _found_elsewhere(plans)
    if in_place is not None:
        return check_and_record(paths, source, in_place[0], in_place[1], commit)
    files = _fetch(paths, source, commit, plans, on_progress, cancel, policy)
    return check_and_record(paths, source, files, "hub-lfs", commit)


def pull_revision(
    paths: Paths,
    record: ModelRecord,
    commit: str,
    on_progress: ProgressCallback | None,
    cancel: threading.Event | None,
    policy: RetryPolicy,
) -> tuple[ModelRecord, tuple[str, ...]]:
    """``record``'s files at ``commit`` and the names of those that changed, in a folder of that
    revision beside the old files: a changed file is downloaded and verified, one whose sha256
    is stored already is linked there (the shards of a model load from one folder). The record
    is checked, not saved: the current revision serves until the caller switches."""
    text = record.source.partition("@")[0] + (f"@{commit}" if "@" in record.source else "")
    source = replace(record.model_source, text=text, revision=commit)
    revision_dir = repo_dir(paths, source.repo_id) / commit[:12]
    _, plans = _remote_plans(source, revision_dir)
    stored = {f.sha256: Path(f.path) for f in record.files}
    changed = [p for p in plans if p[2] not in stored]
    downloaded = _fetch(paths, source, commit, changed, on_progress, cancel, policy)
    fetched = {sha: path for path, sha, _ in downloaded}
    # Only what was just downloaded may be quarantined by the check.
    files = [
        (fetched[sha], sha, True) if sha in fetched else (_link(stored[sha], dest), sha, False)
        for _, dest, sha, _ in plans
    ]
    try:
        checked = checked_record(paths, source, files, "hub-lfs", commit)
    except GuardRefusal:
        for path, _, fresh in files:
            if not fresh:
                path.unlink(missing_ok=True)  # a link made for the refused revision
        if not any(revision_dir.iterdir()):
            revision_dir.rmdir()
        raise
    # Every file of the new revision is the store's own name for it (a link or a download).
    owned = tuple(replace(f, owned=True) for f in checked.files)
    return replace(checked, files=owned), tuple(Path(name).name for name, *_ in changed)


def _link(stored: Path, dest: Path) -> Path:
    """``dest`` names the bytes of ``stored``: a hard link, a symbolic one across disks."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists() and dest.samefile(stored):
        return dest
    dest.unlink(missing_ok=True)
    try:
        dest.hardlink_to(stored)
    except OSError:
        dest.symlink_to(stored.resolve())
    return dest


def _remote_plans(
    source: ModelSource, dest_dir: Path
) -> tuple[str | None, list[tuple[str, Path, str, int | None]]]:
    """The commit ``source`` resolves to and, per file, its name in the repo, where the store
    keeps it under ``dest_dir``, its sha256 and size."""
    from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url

    names = shard_names(source.filename)
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
    return commit, plans


def _fetch(
    paths: Paths,
    source: ModelSource,
    commit: str | None,
    plans: list[tuple[str, Path, str, int | None]],
    on_progress: ProgressCallback | None,
    cancel: threading.Event | None,
    policy: RetryPolicy,
) -> list[tuple[Path, str, bool]]:
    """Each planned file downloaded at ``commit`` and verified (one already whole is kept)."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

    for _, dest, _, _ in plans:
        paths.ensure(dest.parent)
    if plans:
        check_free_disk(
            plans[0][1].parent, sum(_bytes_to_fetch(dest, size or 0) for _, dest, _, size in plans)
        )
    headers = build_hf_headers()
    files = []
    for name, dest, expected, size in plans:
        if not (dest.exists() and sha256_file(dest) == expected):
            url = hf_hub_url(source.repo_id, name, revision=commit, endpoint=hub_endpoint())
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
    return files


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


def _hf_transfer_error(exc: TransferError, source: ModelSource, name: str) -> StoreError:
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
