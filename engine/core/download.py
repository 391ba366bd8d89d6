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

This module holds the retries around the attempts; one attempt is in ``downloadattempt``, the
lock in ``downloadlock``, hashing and writing in ``hashing`` and the progress in
``downloadprogress``.
"""

from __future__ import annotations

import http.client
import os
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lucebox.engine.core.downloadattempt import Partial, Retry, cancelled_error, fetch_attempt
from lucebox.engine.core.downloadlock import one_writer
from lucebox.engine.core.downloadprogress import ProgressCallback, TransferProgress
from lucebox.engine.core.errors import CancelledByUserError, HashMismatchError, TransferError
from lucebox.engine.core.hashing import DiskWriteError, sha256_file

RETRY_AFTER_MAX_S = 600.0
"""A server's Retry-After is honoured up to this; a longer one would look like a hang."""


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
    with one_writer(dest, on_progress, cancel) as waited:
        if waited and dest.exists() and sha256_file(dest) == sha256.lower():
            return dest  # the process we waited for fetched it
        partial = Partial(part, size_bytes)
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


def _fetch_with_retries(
    url: str,
    headers: dict[str, str],
    partial: Partial,
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
            fetch_attempt(
                url,
                headers,
                partial,
                size_bytes,
                name,
                on_progress,
                policy.stall_s,
                cancel,
                attempt,
            )
            return
        except Retry as exc:
            reason, retry_after_s = exc.reason, exc.retry_after_s
        except DiskWriteError as exc:
            raise TransferError(
                f"cannot write {partial.path}: {exc.cause}",
                hint="free space on that disk (the partial is kept), then run the same command",
            ) from exc.cause
        except (OSError, http.client.HTTPException) as exc:
            if cancel is not None and cancel.is_set():
                # The cancel shut the connection down; over TLS that reads as an error.
                raise cancelled_error(name, partial) from exc
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
