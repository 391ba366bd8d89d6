"""The Lucebox engine's decode rate per two-card placement: the ``placements`` section of the
measurement store (plan/speculation/measurements.py), which the route reads to choose a
placement (plan/lucebox/luceboxroute.py)."""

from __future__ import annotations

from pathlib import Path

from lucebox.engine.core.paths import Paths
from lucebox.engine.plan.speculation.measurements import file_identity, read_section, write_section


def placement_key(target: Path, draft: Path | None, engine: str, cards: tuple[str, ...]) -> str:
    """The Lucebox engine's files, build and the cards a two-card placement chooses among."""
    files = f"{file_identity(target)} | {file_identity(draft) if draft else '-'}"
    return f"{files} | {engine} | {' + '.join(cards)}"


def read_placement_rates(paths: Paths, key: str) -> dict[str, float]:
    """Decode tok/s measured per placement (benchmarks/two_gpus_planned_vs_run.py measures them on
    the cards)."""
    entry = read_section(paths, "placements").get(key)
    if not isinstance(entry, dict):
        return {}
    return {
        name: float(rate)
        for name, rate in entry.items()
        if isinstance(rate, int | float) and rate > 0
    }


def write_placement_rate(paths: Paths, key: str, placement: str, decode_tok_s: float) -> None:
    section = read_section(paths, "placements")
    entry = section.get(key)
    kept = entry if isinstance(entry, dict) else {}
    section[key] = {**kept, placement: round(decode_tok_s, 1)}
    write_section(paths, "placements", section)
