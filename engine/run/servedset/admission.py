"""Which loaded models must go before another loads: eviction by memory, not by count (pure).

llama-server's router evicts the least recently used model once more than ``--models-max``
run, whatever their sizes. With models of different sizes that count either over-commits a
device or leaves it half idle (the 47 MiB model of the CPU set could sit beside either other
one, a count of 1 forbids it; three 24 GB-class models on two cards get a count of 1 and one
card idles). Here each model has the device and bytes its plan gives it, and a model that does
not fit beside the loaded ones evicts the least recently used models on its device until it
does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    """Where a model runs and what its plan gives it there."""

    device: str
    planned_bytes: int


def evictions(
    wanted: str,
    loaded: frozenset[str],
    placements: Mapping[str, Placement],
    room_bytes: Mapping[str, int],
    last_used_s: Mapping[str, float],
    busy: frozenset[str] = frozenset(),
) -> tuple[str, ...] | None:
    """The models to unload, least recently used first, so that ``wanted`` fits its device
    (none that need not go); None when it cannot fit even after every idle model there is
    gone (busy ones stay)."""
    if wanted in loaded:
        return ()
    place = placements[wanted]
    here = [alias for alias in loaded if placements[alias].device == place.device]
    used = sum(placements[alias].planned_bytes for alias in here)
    room = room_bytes[place.device]
    chosen: list[str] = []
    for alias in sorted(here, key=lambda a: last_used_s.get(a, 0.0)):
        if used + place.planned_bytes <= room:
            break
        if alias in busy:
            continue
        chosen.append(alias)
        used -= placements[alias].planned_bytes
    if used + place.planned_bytes > room:
        return None
    # Keep any chosen one whose room turned out not to be needed, most recently used first.
    for alias in reversed(list(chosen)):
        if used + placements[alias].planned_bytes + place.planned_bytes <= room:
            used += placements[alias].planned_bytes
            chosen.remove(alias)
    return tuple(chosen)
