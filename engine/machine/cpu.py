"""The host CPU: its architecture and the instruction-set features the kernel reports.

Read from ``/proc/cpuinfo`` on Linux. Elsewhere, or when the file cannot be read, the
features are unknown (``None``), a value front ends show as "not known", never an exception.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class CpuInfo:
    """What an engine build must fit on this PC."""

    arch: str
    """``platform.machine()``: x86_64, aarch64, ..."""
    model_name: str
    features: frozenset[str] | None
    """The kernel's flag names (``avx2``, ``amx_tile``, ...); None when not known."""


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str] | None]:
    """The model name and the first processor's flags (x86 ``flags``, Arm ``Features``)."""
    model = ""
    features: frozenset[str] | None = None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features") and features is None:
            features = frozenset(value.split())
    return model, features


def probe_cpu(cpuinfo: Path = CPUINFO) -> CpuInfo:
    try:
        model, features = parse_cpuinfo(cpuinfo.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        model, features = "", None
    return CpuInfo(platform.machine().lower(), model or platform.processor(), features)
