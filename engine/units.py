"""Byte counts as people read them: one place for GiB and MiB formatting."""

from __future__ import annotations

MIB = 1024**2
GIB = 1024**3


def gib(n_bytes: int | float, digits: int = 1) -> str:
    return f"{n_bytes / GIB:.{digits}f} GiB"


def mib(n_bytes: int | float) -> str:
    return f"{n_bytes / MIB:,.0f} MiB"
