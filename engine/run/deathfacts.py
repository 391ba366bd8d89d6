"""What the machine says when an engine dies: the model file as it is now, who holds the
RAM, and how often the kernel's out-of-memory killer has struck (read by the supervisor
for :mod:`lucebox.engine.run.death`, which names the death from them)."""

from __future__ import annotations

import os

import psutil

from lucebox.engine.run.death import FileStamp


def file_stamp(path: str) -> FileStamp | None:
    """The file as it is now; None when it cannot be read."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return FileStamp(path, info.st_size, info.st_mtime_ns, info.st_ino)


def ram_users(top: int = 3) -> tuple[tuple[str, int], ...]:
    """The programs other than lucebox holding the most RAM now, largest first: name and
    resident bytes."""
    found = []
    for proc in psutil.process_iter(["name", "memory_info"]):
        memory = proc.info.get("memory_info")
        if memory is not None and proc.pid != os.getpid():
            found.append((str(proc.info.get("name") or proc.pid), int(memory.rss)))
    return tuple(sorted(found, key=lambda item: -item[1])[:top])


def oom_kills() -> int | None:
    """How many processes the kernel's out-of-memory killer has killed since boot (any user may
    read it, unlike the kernel log); None where the kernel does not say."""
    try:
        with open("/proc/vmstat", encoding="ascii") as vmstat:
            for line in vmstat:
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def oom_kills_since(at_start: int | None) -> int | None:
    now = oom_kills()
    return None if at_start is None or now is None else now - at_start
