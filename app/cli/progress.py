"""Progress on stderr for the command line: downloads, builds, toolkit fetches."""

from __future__ import annotations

import sys
from collections.abc import Callable

from lucebox.engine.core.downloadprogress import TransferProgress, progress_parts
from lucebox.engine.core.units import MIB


class StderrProgress:
    """Progress on stderr: one rewritten line on a terminal, a line per 10% otherwise.

    A change of ``state`` (a download starting to wait for a retry, say) is always shown; on a
    terminal a line with a state is redrawn at every update, so its countdown moves.
    """

    def __init__(self, label: str) -> None:
        self.label = label
        self.tty = sys.stderr.isatty()
        self.last_percent = -1
        self.last_state = ""

    def update(self, percent: int | None, detail: str = "", *, state: str = "") -> None:
        if percent is None:
            return
        changed = state != self.last_state
        if percent == self.last_percent and not changed and not (self.tty and state):
            return
        if (
            not self.tty
            and not changed
            and percent // 10 == self.last_percent // 10
            and percent < 100
        ):
            return
        self.last_percent, self.last_state = percent, state
        bar = "#" * (percent // 5) + "." * (20 - percent // 5)
        text = f"{self.label} [{bar}] {percent:3d}% {detail}"
        if self.tty:
            print(f"\r\x1b[2K{text[:120]}", end="", file=sys.stderr, flush=True)
        else:
            print(text, file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        """A line of its own, between progress lines."""
        if self.tty and self.last_percent >= 0:
            print(file=sys.stderr)
        self.last_percent = -1
        print(f"{self.label}: {text}", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.tty and self.last_percent >= 0:
            print(file=sys.stderr)


def transfer_progress(label: str) -> Callable[[TransferProgress], None]:
    bar = StderrProgress(label)

    def report(event: TransferProgress) -> None:
        if event.waiting_for_pid is not None:
            bar.note(f"waiting for pid {event.waiting_for_pid} (fetching {event.name})")
            return
        fraction = event.fraction
        detail = ", ".join(
            progress_parts(
                event.rate_bytes_per_s,
                event.eta_s,
                attempt=event.attempt,
                waiting_s=event.waiting_s,
                retry_reason=event.retry_reason,
            )
        )
        state = f"waiting {event.attempt}" if event.waiting_s is not None else ""
        bar.update(int(fraction * 100) if fraction is not None else None, detail, state=state)

    return report


def bytes_progress(label: str) -> Callable[[int], None]:
    """A note every 4 MiB for a download whose size is not known up front."""
    bar = StderrProgress(label)
    shown = [0]

    def report(done_bytes: int) -> None:
        if done_bytes - shown[0] >= 4 * MIB:
            shown[0] = done_bytes
            bar.note(f"{done_bytes / MIB:.0f} MiB downloaded")

    return report
