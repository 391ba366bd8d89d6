"""Resumable HTTP downloads that hash while they write, for files outside the Hugging Face Hub.

A download lands in ``<dest>.part`` and becomes ``dest`` only after its size and sha256 match;
an interrupted one resumes from the partial with a Range request. Nothing that failed a check
is ever left where a finished file would be.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from lucebox.engine.errors import LuceboxError

CHUNK_BYTES = 1024 * 1024
PROGRESS_INTERVAL_S = 0.2
WRITE_BATCH_BYTES = 4 * 1024 * 1024
QUEUE_BLOCKS = 16
"""Batches the writer may fall behind by (64 MiB) before receiving waits for the disk."""
SYNC_EVERY_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class TransferProgress:
    """One progress event of a download; rates are averaged over this session's bytes."""

    name: str
    done_bytes: int
    total_bytes: int | None
    rate_bytes_per_s: float
    eta_s: float | None

    @property
    def fraction(self) -> float | None:
        if not self.total_bytes:
            return None
        return min(1.0, self.done_bytes / self.total_bytes)


ProgressCallback = Callable[[TransferProgress], None]


class TransferError(LuceboxError):
    """A download failed; the partial file (if any) is kept for a resume unless it is bad."""


def sha256_file(path: Path, hasher: hashlib._Hash | None = None) -> str:
    """Hash a whole file at disk speed (1 MiB reads)."""
    digest = hasher if hasher is not None else hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(CHUNK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def _hash_prefix(path: Path) -> tuple[hashlib._Hash, int]:
    digest = hashlib.sha256()
    if not path.exists():
        return digest, 0
    sha256_file(path, digest)
    return digest, path.stat().st_size


def download_file(
    url: str,
    dest: Path,
    *,
    sha256: str,
    size_bytes: int | None = None,
    client: httpx.Client | None = None,
    on_progress: ProgressCallback | None = None,
    timeout_s: float = 30.0,
) -> Path:
    """Download ``url`` to ``dest``, resuming ``dest.part``; verify size and sha256 first."""
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    own_client = client is None
    http = client if client is not None else httpx.Client(timeout=timeout_s, follow_redirects=True)
    try:
        digest, offset = _hash_prefix(part)
        if size_bytes is not None and offset > size_bytes:
            part.unlink()
            digest, offset = hashlib.sha256(), 0
        if size_bytes is None or offset < size_bytes:
            digest, offset = _fetch(http, url, part, digest, offset, size_bytes, on_progress)
    except httpx.HTTPError as exc:
        raise TransferError(
            f"download of {url} failed: {exc}",
            hint=f"run the same command again to resume from {part}",
        ) from exc
    finally:
        if own_client:
            http.close()
    if size_bytes is not None and offset != size_bytes:
        raise TransferError(
            f"download of {url} stopped at {offset} of {size_bytes} bytes",
            hint=f"run the same command again to resume from {part}",
        )
    actual = digest.hexdigest()
    if actual != sha256.lower():
        part.unlink()
        raise TransferError(
            f"{url} has sha256 {actual}, expected {sha256}; the bad file was deleted",
            hint="the server sent different bytes than published: check the URL or try again",
        )
    os.replace(part, dest)
    return dest


def _fetch(
    http: httpx.Client,
    url: str,
    part: Path,
    digest: hashlib._Hash,
    offset: int,
    size_bytes: int | None,
    on_progress: ProgressCallback | None,
) -> tuple[hashlib._Hash, int]:
    # identity: the hash is over the bytes as published, so nothing may decode them in between.
    headers = {"Accept-Encoding": "identity"}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    started_s = time.monotonic()
    session_bytes = 0
    last_report_s = started_s  # the first rate is taken over a whole interval, not one block
    with http.stream("GET", url, headers=headers) as response:
        if response.status_code == 404:
            raise TransferError(f"{url} does not exist (HTTP 404)", hint="check the URL")
        if response.status_code in (401, 403):
            raise TransferError(
                f"{url} refused access (HTTP {response.status_code})",
                hint="check the URL and any token it needs",
            )
        if response.status_code == 416 and size_bytes is None:
            return digest, offset  # the partial already holds the whole file
        response.raise_for_status()
        if offset and response.status_code != 206:
            # The server ignored the Range request: start over rather than append twice.
            digest, offset = hashlib.sha256(), 0
        total = size_bytes
        if total is None and "content-length" in response.headers:
            total = offset + int(response.headers["content-length"])
        name = Path(url.split("?")[0]).name
        mode = "ab" if offset else "wb"
        with part.open(mode) as handle, _DiskWriter(handle, digest) as writer:
            # The network hands over 64 KiB blocks; the writer gets them in batches (one queue
            # hand-off per WRITE_BATCH_BYTES, or per progress interval on a slow link).
            # Whatever is batched when the connection breaks still reaches disk and hash.
            batch: list[bytes] = []
            batched = 0
            try:
                for block in response.iter_raw():
                    batch.append(block)
                    batched += len(block)
                    offset += len(block)
                    session_bytes += len(block)
                    now_s = time.monotonic()
                    due = now_s - last_report_s >= PROGRESS_INTERVAL_S
                    if batched >= WRITE_BATCH_BYTES or due:
                        writer.put(b"".join(batch))
                        batch, batched = [], 0
                    if due:
                        last_report_s = now_s
                        if on_progress is not None:
                            on_progress(
                                _progress(name, offset, total, session_bytes, now_s - started_s)
                            )
            finally:
                if batch:
                    writer.put(b"".join(batch))
        if on_progress is not None:
            elapsed_s = time.monotonic() - started_s
            on_progress(_progress(name, offset, total, session_bytes, elapsed_s))
    return digest, offset


class _DiskWriter:
    """Writes and hashes blocks on a second thread while the first one receives.

    hashlib and file writes release the GIL, so receiving, hashing and writing overlap; on
    leaving (also by an exception or Ctrl-C) every block already received is on disk and in
    the hash, so the partial file matches the bytes counted for a resume.
    """

    def __init__(self, handle: IO[bytes], digest: hashlib._Hash) -> None:
        self.handle = handle
        self.digest = digest
        self.blocks: queue.Queue[bytes | None] = queue.Queue(maxsize=QUEUE_BLOCKS)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="lucebox-disk-writer", daemon=True)

    def __enter__(self) -> _DiskWriter:
        self.thread.start()
        return self

    def put(self, block: bytes) -> None:
        if self.error is not None:
            raise self.error
        self.blocks.put(block)

    def _run(self) -> None:
        unsynced = 0
        while (block := self.blocks.get()) is not None:
            if self.error is not None:
                continue
            try:
                self.handle.write(block)
                self.digest.update(block)
                unsynced += len(block)
                if unsynced >= SYNC_EVERY_BYTES:
                    # Flush to disk while the network keeps going, so the final fsync that
                    # makes the file durable before its rename is short.
                    self.handle.flush()
                    os.fdatasync(self.handle.fileno())
                    unsynced = 0
            except BaseException as exc:
                self.error = exc

    def __exit__(self, *exc_info: object) -> None:
        self.blocks.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error
        self.handle.flush()
        os.fsync(self.handle.fileno())


def _progress(
    name: str, done: int, total: int | None, session_bytes: int, elapsed_s: float
) -> TransferProgress:
    rate = session_bytes / elapsed_s if elapsed_s > 0 else 0.0
    eta = (total - done) / rate if total is not None and rate > 0 else None
    return TransferProgress(name, done, total, rate, eta)
