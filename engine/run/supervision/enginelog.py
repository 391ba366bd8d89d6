"""The engine's log file: every line it writes and every note lucebox adds, rotated by size."""

from __future__ import annotations

from pathlib import Path

LOG_ROTATE_BYTES = 16 * 1024 * 1024
LOG_KEEP = 3


class RotatingLog:
    """Append-only log file that rotates at a size, keeping a few old files."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = path.open("a", encoding="utf-8")

    def write(self, line: str) -> None:
        self.handle.write(line + "\n")
        self.handle.flush()
        if self.handle.tell() > LOG_ROTATE_BYTES:
            self.handle.close()
            for index in range(LOG_KEEP - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{index}")
                if older.exists():
                    older.rename(self.path.with_name(f"{self.path.name}.{index + 1}"))
            self.path.rename(self.path.with_name(f"{self.path.name}.1"))
            self.handle = self.path.open("a", encoding="utf-8")

    def close(self) -> None:
        self.handle.close()
