"""Byte units, and how lucebox writes sizes and rates for people: one place for GiB and MiB."""

from __future__ import annotations

MIB = 2**20
GIB = 2**30


def to_gib(n_bytes: float) -> float:
    return n_bytes / GIB


def gib_text(n_bytes: float, digits: int = 1) -> str:
    """``n_bytes`` in GiB with its unit: ``gib_text(3 * GIB) == "3.0 GiB"``."""
    return f"{n_bytes / GIB:,.{digits}f} GiB"


def mib_text(n_bytes: float, digits: int = 0) -> str:
    """``n_bytes`` in MiB with its unit: ``mib_text(1536 * MIB) == "1,536 MiB"``."""
    return f"{n_bytes / MIB:,.{digits}f} MiB"


def rate_text(bytes_per_s: float) -> str:
    """A transfer rate: ``rate_text(48.5 * MIB) == "48.5 MiB/s"``."""
    return f"{bytes_per_s / MIB:,.1f} MiB/s"
