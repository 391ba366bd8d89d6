"""Resumable HTTP downloads that hash while they write.

A download lands in ``<dest>.part`` and becomes ``dest`` only after its size and sha256 match
and its bytes are on disk; an interrupted one resumes from the partial with a Range request.
Nothing that failed a check is ever left where a finished file would be.

The body is read with the standard library's ``urllib``/``http.client`` ``readinto`` straight
into reused buffers. httpx (used for every other request) parses bodies through h11, which
copies each 64 KiB block twice in Python; on a fast link that capped a model download at a
third of what ``curl`` reaches. urllib brings what a download needs from a client: redirects,
proxies from the environment, TLS (with the same trust store as httpx).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import queue
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import httpx

from lucebox.engine.errors import CancelledByUserError, HashMismatchError, LuceboxError

CHUNK_BYTES = 1024 * 1024
PROGRESS_INTERVAL_S = 0.2
BUFFER_BYTES = 8 * 1024 * 1024
BUFFERS = 8
"""Buffers in flight (64 MiB): how far the writer may fall behind before receiving waits."""
FIRST_READ_BYTES = 64 * 1024
WRITEBACK_EVERY_BYTES = 64 * 1024 * 1024


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
    headers: Mapping[str, str] | None = None,
    on_progress: ProgressCallback | None = None,
    timeout_s: float = 60.0,
    cancel: threading.Event | None = None,
) -> Path:
    """Download ``url`` to ``dest``, resuming ``dest.part``; verify length and sha256 first.

    ``headers`` go to ``url`` and to redirects on the same host only, so a token for the Hub
    never reaches the storage host it redirects to. Setting ``cancel`` stops the download
    between reads with :class:`CancelledByUserError`; the partial file stays for a resume.
    """
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    resume_hint = f"run the same command again to resume from {part}"
    digest, offset = _hash_prefix(part)
    if size_bytes is not None and offset > size_bytes:
        part.unlink()
        digest, offset = hashlib.sha256(), 0
    if size_bytes is None or offset < size_bytes:
        try:
            digest, offset = _fetch(
                url,
                dict(headers or {}),
                part,
                digest,
                offset,
                size_bytes,
                on_progress,
                timeout_s,
                cancel,
            )
        except (OSError, http.client.HTTPException) as exc:
            cause = getattr(exc, "reason", None) or exc
            hint = resume_hint
            if isinstance(cause, TimeoutError):
                reason = f"no data for {timeout_s:g} s"
            elif isinstance(cause, ssl.SSLCertVerificationError):
                reason = f"the server's certificate is not trusted ({cause.verify_message})"
                hint = (
                    "check the system clock and any proxy that intercepts HTTPS; "
                    "SSL_CERT_FILE names a file of extra certificate authorities"
                )
            else:
                reason = str(cause) or type(cause).__name__
            raise TransferError(f"download of {url} failed: {reason}", hint=hint) from exc
    actual = digest.hexdigest()
    if actual != sha256.lower():
        part.unlink()
        raise HashMismatchError(
            f"{url} has sha256 {actual}, expected {sha256}; the bad file was deleted",
            hint="the server sent different bytes than published: check the URL or try again",
        )
    os.replace(part, dest)
    return dest


class _SameHostHeaders(urllib.request.HTTPRedirectHandler):
    """Follows redirects, re-sending credentials only to the host they were meant for."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        redirected = super().redirect_request(req, fp, code, msg, headers, newurl)
        if redirected is not None and urlsplit(newurl).netloc == urlsplit(req.full_url).netloc:
            for name, value in req.unredirected_hdrs.items():
                redirected.add_unredirected_header(name, value)
        return redirected


def _open(
    url: str, headers: dict[str, str], offset: int, timeout_s: float
) -> http.client.HTTPResponse:
    request = urllib.request.Request(url)
    for name, value in headers.items():
        request.add_unredirected_header(name, value)
    # identity: the hash is over the bytes as published, so nothing may decode them in between.
    request.add_header("Accept-Encoding", "identity")
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    opener = urllib.request.build_opener(
        urllib.request.HTTPSHandler(context=httpx.create_ssl_context()), _SameHostHeaders()
    )
    response = opener.open(request, timeout=timeout_s)
    assert isinstance(response, http.client.HTTPResponse)
    return response


def _fetch(
    url: str,
    headers: dict[str, str],
    part: Path,
    digest: hashlib._Hash,
    offset: int,
    size_bytes: int | None,
    on_progress: ProgressCallback | None,
    timeout_s: float,
    cancel: threading.Event | None,
) -> tuple[hashlib._Hash, int]:
    try:
        response = _open(url, headers, offset, timeout_s)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code == 404:
            raise TransferError(f"{url} does not exist (HTTP 404)", hint="check the URL") from exc
        if exc.code in (401, 403):
            raise TransferError(
                f"{url} refused access (HTTP {exc.code})",
                hint="check the URL and any token it needs",
            ) from exc
        if exc.code == 416 and size_bytes is None:
            return digest, offset  # the partial already holds the whole file
        raise TransferError(
            f"{url} answered HTTP {exc.code} {exc.reason}",
            hint="the server may be down; try again later",
        ) from exc
    with response:
        if offset and response.status != 206:
            # The server ignored the Range request: start over rather than append twice.
            digest, offset = hashlib.sha256(), 0
        total = size_bytes
        if total is None and response.length is not None:
            total = offset + response.length
        name = Path(urlsplit(url).path).name
        with part.open("ab" if offset else "wb") as handle, _DiskWriter(handle, digest) as writer:
            offset = _receive(response, writer, offset, total, name, on_progress, cancel)
    if cancel is not None and cancel.is_set():
        raise CancelledByUserError(
            f"download of {name} cancelled; {offset} bytes kept in {part}",
            hint="run the same command again to resume",
        )
    if total is not None and offset < total:
        raise TransferError(
            f"download of {url} stopped at {offset} of {total} bytes",
            hint=f"run the same command again to resume from {part}",
        )
    return digest, offset


def _receive(
    response: http.client.HTTPResponse,
    writer: _DiskWriter,
    offset: int,
    total: int | None,
    name: str,
    on_progress: ProgressCallback | None,
    cancel: threading.Event | None,
) -> int:
    """Fill buffers from the response and hand each to the writer; returns the bytes counted.

    Each read asks for as much as arrives in about half a progress interval (64 KiB at
    first, doubling while reads come back quickly), so a slow link still reports progress
    and a fast one is read in large blocks. A buffer goes to the writer when it is full or a
    progress interval has passed; one that is partly filled when the connection breaks still
    reaches disk and hash, so the partial file matches the bytes counted for a resume.
    A set ``cancel`` ends it after the read in progress, like the end of the body.
    """
    started_s = last_report_s = time.monotonic()
    session_bytes = 0
    read_bytes = FIRST_READ_BYTES
    eof = False
    while not eof:
        buffer = writer.free_buffer()
        view = memoryview(buffer)
        filled = 0
        try:
            while filled < BUFFER_BYTES:
                if cancel is not None and cancel.is_set():
                    eof = True
                    break
                read_started_s = time.monotonic()
                got = response.readinto(view[filled : filled + read_bytes])
                if not got:
                    eof = True
                    break
                filled += got
                now_s = time.monotonic()
                if now_s - read_started_s < PROGRESS_INTERVAL_S / 2:
                    read_bytes = min(read_bytes * 2, BUFFER_BYTES)
                else:
                    read_bytes = max(read_bytes // 2, FIRST_READ_BYTES)
                if now_s - last_report_s >= PROGRESS_INTERVAL_S:
                    break
        finally:
            writer.put(buffer, filled)
            offset += filled
            session_bytes += filled
        now_s = time.monotonic()
        due = now_s - last_report_s >= PROGRESS_INTERVAL_S
        if due:
            last_report_s = now_s
        if on_progress is not None and (due or eof):
            on_progress(_progress(name, offset, total, session_bytes, now_s - started_s))
    return offset


class _DiskWriter:
    """Hashes and writes filled buffers on two more threads while the first one receives.

    A buffer goes receive → hash → write → back to the free list, so the three stages run at
    once (hashlib and file writes release the GIL) and a download runs at the pace of the
    slowest one rather than of their sum. On leaving (also by an exception or Ctrl-C) every
    buffer handed over is in the hash and on disk, and the file is synced: a finished
    download must survive a power cut before it is renamed to its final name. Write-back is
    started every 64 MiB without waiting for it, so the disk works alongside the network and
    the final sync has little left to do.
    """

    def __init__(self, handle: IO[bytes], digest: hashlib._Hash) -> None:
        self.handle = handle
        self.digest = digest
        self.free: queue.Queue[bytearray] = queue.Queue()
        for _ in range(BUFFERS):
            self.free.put(bytearray(BUFFER_BYTES))
        self.to_hash: queue.Queue[tuple[bytearray, int] | None] = queue.Queue()
        self.to_write: queue.Queue[tuple[bytearray, int] | None] = queue.Queue()
        self.error: BaseException | None = None
        self.threads = [
            threading.Thread(target=self._hash, name="lucebox-download-hash", daemon=True),
            threading.Thread(target=self._write, name="lucebox-download-write", daemon=True),
        ]

    def __enter__(self) -> _DiskWriter:
        for thread in self.threads:
            thread.start()
        return self

    def free_buffer(self) -> bytearray:
        if self.error is not None:
            raise self.error
        return self.free.get()

    def put(self, buffer: bytearray, filled_bytes: int) -> None:
        self.to_hash.put((buffer, filled_bytes))

    def _hash(self) -> None:
        while (item := self.to_hash.get()) is not None:
            buffer, filled_bytes = item
            self.digest.update(memoryview(buffer)[:filled_bytes])
            self.to_write.put(item)
        self.to_write.put(None)

    def _write(self) -> None:
        fd = self.handle.fileno()
        written = kicked = dropped = self.handle.tell()
        while (item := self.to_write.get()) is not None:
            buffer, filled_bytes = item
            if self.error is None and filled_bytes:
                try:
                    self.handle.write(memoryview(buffer)[:filled_bytes])
                    written += filled_bytes
                    if written - kicked >= WRITEBACK_EVERY_BYTES:
                        # The window before this one has been written back by now.
                        _start_writeback(fd, dropped, written)
                        dropped, kicked = kicked, written
                except BaseException as exc:
                    self.error = exc
            self.free.put(buffer)

    def __exit__(self, *exc_info: object) -> None:
        self.to_hash.put(None)
        for thread in self.threads:
            thread.join()
        if self.error is not None:
            raise self.error
        self.handle.flush()
        os.fsync(self.handle.fileno())


def _start_writeback(fd: int, start: int, end: int) -> None:
    """Start writing ``[start, end)`` to disk without waiting for it.

    On Linux, POSIX_FADV_DONTNEED starts write-back of dirty pages and drops pages already
    written: a model download should not push the rest of the page cache out either. Where
    the call does not exist, the final sync does all the work.
    """
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None:
        advise(fd, start, end - start, os.POSIX_FADV_DONTNEED)


def _progress(
    name: str, done: int, total: int | None, session_bytes: int, elapsed_s: float
) -> TransferProgress:
    rate = session_bytes / elapsed_s if elapsed_s > 0 else 0.0
    eta = (total - done) / rate if total is not None and rate > 0 else None
    return TransferProgress(name, done, total, rate, eta)
