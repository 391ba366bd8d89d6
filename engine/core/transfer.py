"""Resumable HTTP downloads that hash while they write and ride out a flaky link.

A download lands in ``<dest>.part`` and becomes ``dest`` only after its size and sha256 match
and its bytes are on disk; an interrupted one resumes from the partial with a Range request.
Nothing that failed a check is ever left where a finished file would be.

Within one run, a cut connection, a reset, a stall (no byte for ``stall_s``), a 5xx or a 429
is followed by a wait (1, 2, 4 ... s up to ``backoff_max_s``, or the server's Retry-After) and a
resume from the bytes already received: the running sha256 and the offset carry over, so nothing
on disk is read again. The download gives up after ``max_idle_attempts`` attempts in a row that
brought no new byte; the partial stays for the next run. A 401/403/404, a hash mismatch, a disk
that cannot be written and a connection that fails before the server ever answered are not
retried: waiting will not change them.

One process writes a given file at a time (a lock beside it); a second one waits for the first
and then uses its finished file.

The body is read with the standard library's ``urllib``/``http.client`` ``readinto`` straight
into reused buffers. httpx (used for every other request) parses bodies through h11, which
copies each 64 KiB block twice in Python; on a fast link that capped a model download at a
third of what ``curl`` reaches. urllib brings what a download needs from a client: redirects,
proxies from the environment, TLS (with the same trust store as httpx).

It stays one module past our usual size: the fetch loop, its retries and the receive, hash and
write threads all act on one partial file's offset and running hash, and a split would hand
that state across modules.
"""

from __future__ import annotations

import contextlib
import email.utils
import fcntl
import hashlib
import http.client
import math
import os
import queue
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import httpx

from lucebox.engine.core.errors import CancelledByUserError, FetchError, HashMismatchError
from lucebox.engine.core.units import rate_text

CHUNK_BYTES = 1024 * 1024
PROGRESS_INTERVAL_S = 0.2
BUFFER_BYTES = 8 * 1024 * 1024
BUFFERS = 8
"""Buffers in flight (64 MiB): how far the writer may fall behind before receiving waits."""
FIRST_READ_BYTES = 64 * 1024
WRITEBACK_EVERY_BYTES = 64 * 1024 * 1024
RATE_WINDOW_S = 5.0
"""The rate is measured over this much of the latest receiving, so it follows the link."""
MIN_RATE_SPAN_S = 1.0
"""No rate (and so no ETA) is claimed from less than this much receiving on a connection."""
RETRY_AFTER_MAX_S = 600.0
"""A server's Retry-After is honoured up to this; a longer one would look like a hang."""
LOCK_POLL_S = 0.2
CANCEL_POLL_S = 0.1
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """How long a download keeps trying on a flaky link (settings ``download.*``).

    With the defaults a download gives up after 10 attempts in a row that brought no new byte:
    about 4 minutes of waiting (1+2+4+8+16+32+60+60+60 s) plus up to 30 s of silence each,
    long enough to ride out a router restart.
    """

    max_idle_attempts: int = 10
    """Attempts in a row with no new byte before giving up."""
    stall_s: float = 30.0
    """A connection that sends nothing for this long is dropped and resumed."""
    backoff_max_s: float = 60.0
    """Longest wait between attempts (the waits double from 1 s up to this)."""
    first_backoff_s: float = 1.0

    def backoff_s(self, idle_attempts: int) -> float:
        """The wait after a failed attempt; ``idle_attempts`` in a row brought no new byte."""
        doubling: float = self.first_backoff_s * 2.0 ** max(idle_attempts - 1, 0)
        return min(doubling, self.backoff_max_s)


@dataclass(frozen=True)
class TransferProgress:
    """One progress event of a download.

    The rate is over the latest few seconds of the current connection; it and the ETA are None
    until enough is known. While the download waits to retry, ``waiting_s`` counts down to the
    next attempt; while another process fetches the same file, ``waiting_for_pid`` names it.
    """

    name: str
    done_bytes: int
    total_bytes: int | None
    rate_bytes_per_s: float | None
    eta_s: float | None
    attempt: int = 1
    """Which attempt of this download is running, or is next while waiting, from 1."""
    waiting_s: float | None = None
    """Seconds until the next attempt, while waiting to retry."""
    retry_reason: str = ""
    """Why the last attempt stopped, while waiting to retry."""
    waiting_for_pid: int | None = None
    """The process fetching this same file, while this one waits for it."""

    @property
    def fraction(self) -> float | None:
        if not self.total_bytes:
            return None
        return min(1.0, self.done_bytes / self.total_bytes)


ProgressCallback = Callable[[TransferProgress], None]


class TransferError(FetchError):
    """A download failed; the partial file (if any) is kept for a resume unless it is bad."""


class TransferRefusedError(TransferError):
    """The server refused the file (401, 403, 404, or another 4xx); retrying will not help."""

    def __init__(self, message: str, *, status: int, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.status = status


def duration_text(seconds: float) -> str:
    """A time left for people: whole seconds rounded up, so it reads 0 only at the end."""
    whole_s = max(1, math.ceil(seconds))
    if whole_s < 60:
        return f"{whole_s} s"
    if whole_s < 3600:
        return f"{whole_s // 60} min {whole_s % 60:02d} s"
    return f"{whole_s // 3600} h {whole_s % 3600 // 60:02d} min"


def progress_parts(
    rate_bytes_per_s: float | None,
    eta_s: float | None,
    *,
    attempt: int = 1,
    waiting_s: float | None = None,
    retry_reason: str = "",
) -> tuple[str, ...]:
    """The words of a download's progress, the same in the CLI (", ") and the TUI (" · ").

    "—" stands for a rate or ETA not known yet; a finished download (ETA 0) shows no ETA.
    While waiting to retry: why, and when which attempt starts.
    """
    if waiting_s is not None:
        return (retry_reason, f"attempt {attempt} in {duration_text(waiting_s)}")
    parts = [rate_text(rate_bytes_per_s) if rate_bytes_per_s is not None else "— MiB/s"]
    if eta_s is None:
        parts.append("— left")
    elif eta_s > 0:
        parts.append(f"{duration_text(eta_s)} left")
    if attempt > 1:
        parts.append(f"attempt {attempt}")
    return tuple(parts)


def sha256_file(path: Path, hasher: hashlib._Hash | None = None) -> str:
    """Hash a whole file at disk speed (1 MiB reads)."""
    digest = hasher if hasher is not None else hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(CHUNK_BYTES):
            digest.update(block)
    return digest.hexdigest()


class _Partial:
    """The ``.part`` file's running sha256 and length, kept across the attempts of one run."""

    def __init__(self, path: Path, size_bytes: int | None) -> None:
        self.path = path
        self.digest = hashlib.sha256()
        self.offset = 0
        if path.exists():
            sha256_file(path, self.digest)
            self.offset = path.stat().st_size
        if size_bytes is not None and self.offset > size_bytes:
            path.unlink()
            self.digest, self.offset = hashlib.sha256(), 0
        self.answered = False
        """The server has answered at least once in this run (so it exists and is reachable)."""

    def restart(self) -> None:
        self.digest, self.offset = hashlib.sha256(), 0


class _Retry(Exception):
    """An attempt ended in a way that another attempt may get past."""

    def __init__(self, reason: str, retry_after_s: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


class _DiskWriteError(Exception):
    """Writing the partial file failed (a full disk, say): not a network fault."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def download_file(
    url: str,
    dest: Path,
    *,
    sha256: str,
    size_bytes: int | None = None,
    headers: Mapping[str, str] | None = None,
    on_progress: ProgressCallback | None = None,
    policy: RetryPolicy | None = None,
    cancel: threading.Event | None = None,
) -> Path:
    """Download ``url`` to ``dest``, resuming ``dest.part``; verify length and sha256 first.

    ``headers`` go to ``url`` and to redirects on the same host only, so a token for the Hub
    never reaches the storage host it redirects to. Setting ``cancel`` stops the download
    between reads (or a wait) with :class:`CancelledByUserError`; the partial file stays for a
    resume.
    """
    policy = policy or RetryPolicy()
    part = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    name = dest.name
    with _one_writer(dest, on_progress, cancel) as waited:
        if waited and dest.exists() and sha256_file(dest) == sha256.lower():
            return dest  # the process we waited for fetched it
        partial = _Partial(part, size_bytes)
        if size_bytes is None or partial.offset < size_bytes:
            _fetch_with_retries(
                url, dict(headers or {}), partial, size_bytes, name, on_progress, policy, cancel
            )
        actual = partial.digest.hexdigest()
        if actual != sha256.lower():
            part.unlink()
            raise HashMismatchError(
                f"{url} has sha256 {actual}, expected {sha256}; the bad file was deleted",
                hint="the server sent different bytes than published: check the URL or try again",
            )
        os.replace(part, dest)
    return dest


@contextmanager
def _one_writer(
    dest: Path, on_progress: ProgressCallback | None, cancel: threading.Event | None
) -> Iterator[bool]:
    """Hold ``<dest>.lock`` while writing ``dest``; yields whether another process held it first.

    The holder deletes the lock file before unlocking it; a waiter that then gets the lock of a
    deleted file sees that the name now points elsewhere (or nowhere) and tries again.
    """
    lock_path = dest.with_name(dest.name + ".lock")
    waited = False
    while True:
        handle = lock_path.open("a+")
        try:
            if not _try_lock(handle):
                if not waited and on_progress is not None:
                    handle.seek(0)
                    holder = handle.read().strip()
                    pid = int(holder) if holder.isdigit() else 0
                    on_progress(
                        TransferProgress(dest.name, 0, None, None, None, waiting_for_pid=pid)
                    )
                waited = True
                _pause_or_cancel(LOCK_POLL_S, cancel, dest.name)
                continue
            if not _same_file(lock_path, handle):
                continue
            handle.truncate(0)
            handle.write(str(os.getpid()))
            handle.flush()
            try:
                yield waited
            finally:
                lock_path.unlink(missing_ok=True)
            return
        finally:
            handle.close()


def _try_lock(handle: IO[str]) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _same_file(path: Path, handle: IO[str]) -> bool:
    try:
        return path.stat().st_ino == os.fstat(handle.fileno()).st_ino
    except FileNotFoundError:
        return False


def _pause_or_cancel(pause_s: float, cancel: threading.Event | None, name: str) -> None:
    if cancel is None:
        time.sleep(pause_s)
    elif cancel.wait(pause_s):
        raise CancelledByUserError(
            f"stopped waiting for the other download of {name}", hint="that download carries on"
        )


def _fetch_with_retries(
    url: str,
    headers: dict[str, str],
    partial: _Partial,
    size_bytes: int | None,
    name: str,
    on_progress: ProgressCallback | None,
    policy: RetryPolicy,
    cancel: threading.Event | None,
) -> None:
    """Attempts until the body is complete, waiting between them; raises when it gives up."""
    resume_hint = f"run the same command again to resume from {partial.path}"
    attempt = 1
    idle_attempts = 0
    furthest = partial.offset
    while True:
        try:
            _fetch(url, headers, partial, size_bytes, name, on_progress, policy, cancel, attempt)
            return
        except _Retry as exc:
            reason, retry_after_s = exc.reason, exc.retry_after_s
        except _DiskWriteError as exc:
            raise TransferError(
                f"cannot write {partial.path}: {exc.cause}",
                hint="free space on that disk (the partial is kept), then run the same command",
            ) from exc.cause
        except (OSError, http.client.HTTPException) as exc:
            if cancel is not None and cancel.is_set():
                # The cancel shut the connection down; over TLS that reads as an error.
                raise _cancelled(name, partial) from exc
            cause = getattr(exc, "reason", None) or exc
            if isinstance(cause, ssl.SSLCertVerificationError):
                raise TransferError(
                    f"download of {url} failed: the server's certificate is not trusted "
                    f"({cause.verify_message})",
                    hint="check the system clock and any proxy that intercepts HTTPS; "
                    "SSL_CERT_FILE names a file of extra certificate authorities",
                ) from exc
            if isinstance(cause, TimeoutError):
                reason = f"no data for {policy.stall_s:g} s"
            else:
                reason = str(cause) or type(cause).__name__
            if not partial.answered:
                raise TransferError(
                    f"download of {url} failed: {reason}", hint=resume_hint
                ) from exc
            retry_after_s = None
        if partial.offset > furthest:
            furthest, idle_attempts = partial.offset, 0
        else:
            idle_attempts += 1
        if idle_attempts >= policy.max_idle_attempts:
            total = f" of {size_bytes}" if size_bytes is not None else ""
            raise TransferError(
                f"download of {name} gave up after {idle_attempts} attempts in a row without "
                f"a new byte (last: {reason}); {partial.offset}{total} bytes are on disk",
                hint=resume_hint,
            )
        wait_s = policy.backoff_s(idle_attempts)
        if retry_after_s is not None:
            wait_s = max(wait_s, min(retry_after_s, RETRY_AFTER_MAX_S))
        attempt += 1
        _wait_to_retry(
            wait_s, reason, attempt, partial.offset, size_bytes, name, on_progress, cancel
        )


def _cancelled(name: str, partial: _Partial) -> CancelledByUserError:
    return CancelledByUserError(
        f"download of {name} cancelled; {partial.offset} bytes kept in {partial.path}",
        hint="run the same command again to resume",
    )


def _wait_to_retry(
    wait_s: float,
    reason: str,
    attempt: int,
    done_bytes: int,
    total_bytes: int | None,
    name: str,
    on_progress: ProgressCallback | None,
    cancel: threading.Event | None,
) -> None:
    """Sleep until the next attempt, reporting the countdown about once a second."""
    until_s = time.monotonic() + wait_s
    while (left_s := until_s - time.monotonic()) > 0:
        if on_progress is not None:
            on_progress(
                TransferProgress(
                    name,
                    done_bytes,
                    total_bytes,
                    None,
                    None,
                    attempt=attempt,
                    waiting_s=left_s,
                    retry_reason=reason,
                )
            )
        step_s = min(left_s, 1.0)
        if cancel is None:
            time.sleep(step_s)
        elif cancel.wait(step_s):
            raise CancelledByUserError(
                f"download of {name} cancelled while waiting to retry; {done_bytes} bytes are kept",
                hint="run the same command again to resume",
            )


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


def _retry_after_s(value: str | None) -> float | None:
    """A Retry-After header in seconds: a number of seconds or an HTTP date."""
    if not value:
        return None
    if value.strip().isdigit():
        return float(value.strip())
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _fetch(
    url: str,
    headers: dict[str, str],
    partial: _Partial,
    size_bytes: int | None,
    name: str,
    on_progress: ProgressCallback | None,
    policy: RetryPolicy,
    cancel: threading.Event | None,
    attempt: int,
) -> None:
    """One attempt: request the rest of the file and append it to the partial."""
    try:
        response = _open(url, headers, partial.offset, policy.stall_s)
    except urllib.error.HTTPError as exc:
        exc.close()
        partial.answered = True
        if exc.code == 404:
            raise TransferRefusedError(
                f"{url} does not exist (HTTP 404)", status=404, hint="check the URL"
            ) from exc
        if exc.code in (401, 403):
            raise TransferRefusedError(
                f"{url} refused access (HTTP {exc.code})",
                status=exc.code,
                hint="check the URL and any token it needs",
            ) from exc
        if exc.code == 416 and size_bytes is None:
            return  # the partial already holds the whole file
        if exc.code in RETRYABLE_STATUS:
            raise _Retry(
                f"HTTP {exc.code} {exc.reason}", _retry_after_s(exc.headers.get("Retry-After"))
            ) from exc
        raise TransferRefusedError(
            f"{url} answered HTTP {exc.code} {exc.reason}",
            status=exc.code,
            hint="check the URL; the server will not send this file as asked",
        ) from exc
    partial.answered = True
    with response:
        if partial.offset and response.status != 206:
            # The server ignored the Range request: start over rather than append twice.
            partial.restart()
        total = size_bytes
        if total is None and response.length is not None:
            total = partial.offset + response.length
        try:
            handle = partial.path.open("ab" if partial.offset else "wb")
        except OSError as exc:
            raise _DiskWriteError(exc) from exc
        with (
            handle,
            _DiskWriter(handle, partial.digest) as writer,
            _shut_down_on_cancel(response, cancel),
        ):
            _receive(response, writer, partial, total, name, on_progress, cancel, attempt)
    if cancel is not None and cancel.is_set():
        raise _cancelled(name, partial)
    if total is not None and partial.offset < total:
        raise _Retry(f"the connection closed at {partial.offset} of {total} bytes")


@contextmanager
def _shut_down_on_cancel(
    response: http.client.HTTPResponse, cancel: threading.Event | None
) -> Iterator[None]:
    """While inside, a set ``cancel`` shuts the connection down from a watcher thread.

    A read blocked on a stalled link would otherwise hold a cancel (quitting the TUI) for up to
    ``stall_s``; after the shutdown it returns at once, as at the end of the body. The watcher
    is joined before leaving, so it never touches a descriptor the response has closed.
    """
    if cancel is None:
        yield
        return
    finished = threading.Event()

    def watch() -> None:
        while not finished.is_set():
            if cancel.wait(CANCEL_POLL_S):
                # A duplicate of the descriptor: shutdown acts on the connection itself.
                with (
                    contextlib.suppress(OSError, ValueError),
                    socket.socket(fileno=os.dup(response.fileno())) as connection,
                ):
                    connection.shutdown(socket.SHUT_RDWR)
                return

    watcher = threading.Thread(target=watch, name="lucebox-download-cancel", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        finished.set()
        watcher.join()


class _BodyReader:
    """Reads a response body one receive at a time, straight into the caller's buffer.

    ``HTTPResponse.readinto`` (and ``BufferedReader.readinto1`` after bytes that were read
    ahead with the headers) may receive more than once per call; when a later receive times out
    (a stall), the bytes already copied are lost from the count and would be fetched again.
    With a known length, the read-ahead is taken first with ``read1`` and then the socket is
    read directly, so every byte that arrived is counted; a chunked body uses ``readinto``.
    """

    def __init__(self, response: http.client.HTTPResponse) -> None:
        self.response = response
        self.left_bytes = None if response.chunked else response.length
        self.raw = getattr(response.fp, "raw", None)
        self.read_ahead_taken = False

    def readinto(self, view: memoryview) -> int:
        if self.left_bytes is None or self.raw is None:
            return self.response.readinto(view)
        if self.left_bytes <= 0:
            return 0
        view = view[: self.left_bytes]
        if self.read_ahead_taken:
            got: int = self.raw.readinto(view) or 0
        else:
            block = self.response.fp.read1(len(view))
            self.read_ahead_taken = True
            got = len(block)
            view[:got] = block
        self.left_bytes -= got
        return got


class _RateMeter:
    """Bytes per second over the latest ``RATE_WINDOW_S`` of one connection."""

    def __init__(self, now_s: float, done_bytes: int) -> None:
        self.samples: deque[tuple[float, int]] = deque([(now_s, done_bytes)])

    def add(self, now_s: float, done_bytes: int) -> float | None:
        """Record a sample; returns the rate, or None while under ``MIN_RATE_SPAN_S`` is seen."""
        self.samples.append((now_s, done_bytes))
        while len(self.samples) > 2 and self.samples[1][0] <= now_s - RATE_WINDOW_S:
            self.samples.popleft()
        first_s, first_bytes = self.samples[0]
        span_s = now_s - first_s
        if span_s < MIN_RATE_SPAN_S:
            return None
        return (done_bytes - first_bytes) / span_s


def _receive(
    response: http.client.HTTPResponse,
    writer: _DiskWriter,
    partial: _Partial,
    total: int | None,
    name: str,
    on_progress: ProgressCallback | None,
    cancel: threading.Event | None,
    attempt: int,
) -> None:
    """Fill buffers from the response and hand each to the writer, counting into ``partial``.

    Each read asks for as much as arrives in about half a progress interval (64 KiB at
    first, doubling while reads come back quickly), so a slow link still reports progress
    and a fast one is read in large blocks. A buffer goes to the writer when it is full or a
    progress interval has passed; one that is partly filled when the connection breaks still
    reaches disk and hash, so the partial file matches the bytes counted for a resume.
    A set ``cancel`` ends it after the read in progress, like the end of the body.
    """
    last_report_s = time.monotonic()
    meter = _RateMeter(last_report_s, partial.offset)
    body = _BodyReader(response)
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
                got = body.readinto(view[filled : filled + read_bytes])
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
            partial.offset += filled
        now_s = time.monotonic()
        due = now_s - last_report_s >= PROGRESS_INTERVAL_S
        if due:
            last_report_s = now_s
        if on_progress is not None and (due or eof):
            rate = meter.add(now_s, partial.offset)
            on_progress(_progress(name, partial.offset, total, rate, attempt))


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
            raise _DiskWriteError(self.error)
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
            raise _DiskWriteError(self.error)
        try:
            self.handle.flush()
            os.fsync(self.handle.fileno())
        except OSError as exc:
            raise _DiskWriteError(exc) from exc


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
    name: str, done: int, total: int | None, rate: float | None, attempt: int
) -> TransferProgress:
    eta: float | None = None
    if total is not None and done >= total:
        eta = 0.0
    elif total is not None and rate:
        eta = (total - done) / rate
    return TransferProgress(name, done, total, rate, eta, attempt=attempt)
