"""sha256 of bytes on disk: a whole file hashed at disk speed, and a download's buffers hashed
and written on two threads while the next one is received."""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from pathlib import Path
from typing import IO

CHUNK_BYTES = 1024 * 1024
BUFFER_BYTES = 8 * 1024 * 1024
BUFFERS = 8
"""Buffers in flight (64 MiB): how far the writer may fall behind before receiving waits."""
WRITEBACK_EVERY_BYTES = 64 * 1024 * 1024


def sha256_file(path: Path, hasher: hashlib._Hash | None = None) -> str:
    """Hash a whole file at disk speed (1 MiB reads)."""
    digest = hasher if hasher is not None else hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(CHUNK_BYTES):
            digest.update(block)
    return digest.hexdigest()


class DiskWriteError(Exception):
    """Writing the partial file failed (a full disk, say): not a network fault."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class DiskWriter:
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

    def __enter__(self) -> DiskWriter:
        for thread in self.threads:
            thread.start()
        return self

    def free_buffer(self) -> bytearray:
        if self.error is not None:
            raise DiskWriteError(self.error)
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
            raise DiskWriteError(self.error)
        try:
            self.handle.flush()
            os.fsync(self.handle.fileno())
        except OSError as exc:
            raise DiskWriteError(exc) from exc


def _start_writeback(fd: int, start: int, end: int) -> None:
    """Start writing ``[start, end)`` to disk without waiting for it.

    On Linux, POSIX_FADV_DONTNEED starts write-back of dirty pages and drops pages already
    written: a model download should not push the rest of the page cache out either. Where
    the call does not exist, the final sync does all the work.
    """
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None:
        advise(fd, start, end - start, os.POSIX_FADV_DONTNEED)
