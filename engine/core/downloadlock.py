"""One process writes a given download at a time: a lock file beside it, which a second
process waits on and then uses the first one's finished file."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from lucebox.engine.core.downloadprogress import ProgressCallback, TransferProgress
from lucebox.engine.core.errors import CancelledByUserError

LOCK_POLL_S = 0.2


@contextmanager
def one_writer(
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
