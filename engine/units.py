"""Byte counts and rates as people read them: one place for GiB and MiB formatting."""

from __future__ import annotations

MIB = 1024**2
GIB = 1024**3


def gib(n_bytes: int | float, digits: int = 1) -> str:
    """``n_bytes`` in GiB with its unit: ``gib(3 * GIB) == "3.0 GiB"``."""
    return f"{n_bytes / GIB:.{digits}f} GiB"


def mib(n_bytes: int | float) -> str:
    """``n_bytes`` in whole MiB with its unit: ``mib(1536 * MIB) == "1,536 MiB"``."""
    return f"{n_bytes / MIB:,.0f} MiB"


def mib_per_s(bytes_per_s: float) -> str:
    """A transfer rate: ``mib_per_s(48.5 * MIB) == "48.5 MiB/s"``."""
    return f"{bytes_per_s / MIB:.1f} MiB/s"


def in_gib(n_bytes: int | float) -> float:
    """The number of GiB, for a figure whose unit is written once for several."""
    return n_bytes / GIB
