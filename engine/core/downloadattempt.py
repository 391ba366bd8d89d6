"""One attempt of a resumable download: ask for the rest of the file with a Range request and
append what arrives to the partial file, hashing it on the way.

The body is read with the standard library's ``urllib``/``http.client`` ``readinto`` straight
into reused buffers. httpx (used for every other request) parses bodies through h11, which
copies each 64 KiB block twice in Python; on a fast link that capped a model download at a
third of what ``curl`` reaches. urllib brings what a download needs from a client: redirects,
proxies from the environment, TLS (with the same trust store as httpx).
"""

from __future__ import annotations

import contextlib
import email.utils
import hashlib
import http.client
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import httpx

from lucebox.engine.core.downloadprogress import (
    PROGRESS_INTERVAL_S,
    ProgressCallback,
    RateMeter,
    progress_event,
)
from lucebox.engine.core.errors import CancelledByUserError, TransferRefusedError
from lucebox.engine.core.hashing import BUFFER_BYTES, DiskWriteError, DiskWriter, sha256_file

FIRST_READ_BYTES = 64 * 1024
CANCEL_POLL_S = 0.1
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class Partial:
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


class Retry(Exception):
    """An attempt ended in a way that another attempt may get past."""

    def __init__(self, reason: str, retry_after_s: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


def cancelled_error(name: str, partial: Partial) -> CancelledByUserError:
    """The error of a download cancelled between reads; its partial stays for a resume."""
    return CancelledByUserError(
        f"download of {name} cancelled; {partial.offset} bytes kept in {partial.path}",
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


def fetch_attempt(
    url: str,
    headers: dict[str, str],
    partial: Partial,
    size_bytes: int | None,
    name: str,
    on_progress: ProgressCallback | None,
    stall_s: float,
    cancel: threading.Event | None,
    attempt: int,
) -> None:
    """One attempt: request the rest of the file and append it to the partial."""
    try:
        response = _open(url, headers, partial.offset, stall_s)
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
            raise Retry(
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
            raise DiskWriteError(exc) from exc
        with (
            handle,
            DiskWriter(handle, partial.digest) as writer,
            _shut_down_on_cancel(response, cancel),
        ):
            _receive(response, writer, partial, total, name, on_progress, cancel, attempt)
    if cancel is not None and cancel.is_set():
        raise cancelled_error(name, partial)
    if total is not None and partial.offset < total:
        raise Retry(f"the connection closed at {partial.offset} of {total} bytes")


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


def _receive(
    response: http.client.HTTPResponse,
    writer: DiskWriter,
    partial: Partial,
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
    meter = RateMeter(last_report_s, partial.offset)
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
            on_progress(progress_event(name, partial.offset, total, rate, attempt))
