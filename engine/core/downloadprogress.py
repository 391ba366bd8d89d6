"""A download's progress: the event a download reports, its rate over the latest seconds, and
its words for people.

The same words show in the CLI and the TUI; a download reports about every
``PROGRESS_INTERVAL_S``, while it waits to retry, and while it waits for another process.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from lucebox.engine.core.units import rate_text

PROGRESS_INTERVAL_S = 0.2
RATE_WINDOW_S = 5.0
"""The rate is measured over this much of the latest receiving, so it follows the link."""
MIN_RATE_SPAN_S = 1.0
"""No rate (and so no ETA) is claimed from less than this much receiving on a connection."""


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


class RateMeter:
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


def progress_event(
    name: str, done: int, total: int | None, rate: float | None, attempt: int
) -> TransferProgress:
    """The event of a running download, with its ETA where the total and a rate are known."""
    eta: float | None = None
    if total is not None and done >= total:
        eta = 0.0
    elif total is not None and rate:
        eta = (total - done) / rate
    return TransferProgress(name, done, total, rate, eta, attempt=attempt)
