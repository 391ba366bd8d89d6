"""How fast this PC's CPU reads prompts, per model: the ``prefill`` section of the measurement
store (plan/speculation/measurements.py), which bounds a CPU launch's context
(plan/memory/cpuread.py) and which a CPU run's samples feed."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from lucebox.engine.core.paths import Paths
from lucebox.engine.plan.speculation.measurements import file_identity, read_section, write_section

PREFILL_MIN_TOKENS = 2048
"""A prefill rate is kept once this many prompt tokens were read: fewer say little about a
long read."""
PREFILL_REWRITE_TOKENS = 4096
"""Later measurements rewrite the store after this many more tokens (not on every sample)."""


@dataclass(frozen=True)
class PrefillRate:
    """The engine's own prefill totals for one model served on this many CPU cores."""

    tokens: int
    seconds: float
    cores: int
    at: float

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def _prefill_key(paths: Paths, model: Path, cores: int) -> str:
    return f"{file_identity(model, paths)} | {cores} cores"


def read_prefill(paths: Paths, model: Path, cores: int) -> PrefillRate | None:
    """The prefill rate measured for ``model`` on this many cores, once it read enough."""
    entry = read_section(paths, "prefill").get(_prefill_key(paths, model, cores))
    try:
        rate = PrefillRate(**entry) if isinstance(entry, dict) else None
    except TypeError:
        return None
    if rate is None or rate.tokens < PREFILL_MIN_TOKENS or rate.seconds <= 0:
        return None
    return rate


def write_prefill(paths: Paths, model: Path, cores: int, tokens: int, seconds: float) -> None:
    section = read_section(paths, "prefill")
    section[_prefill_key(paths, model, cores)] = vars(
        PrefillRate(tokens, round(seconds, 3), cores, time.time())
    )
    write_section(paths, "prefill", section)


class PrefillRecorder:
    """Feeds one CPU run's cumulative prefill totals into the store, now and then."""

    def __init__(self, paths: Paths, model: Path, cores: int) -> None:
        self.paths, self.model, self.cores = paths, model, cores
        self.written_tokens = 0

    def observe(self, tokens_total: int, seconds_total: float) -> None:
        if tokens_total < PREFILL_MIN_TOKENS:
            return
        if self.written_tokens and tokens_total - self.written_tokens < PREFILL_REWRITE_TOKENS:
            return
        try:
            write_prefill(self.paths, self.model, self.cores, tokens_total, seconds_total)
        except OSError:
            return  # a measurement is worth a retry on the next sample, not a crash
        self.written_tokens = tokens_total
