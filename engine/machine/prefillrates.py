"""How fast this machine's CPU reads prompts, per model, as measured while lucebox served it.

The run records the engine's own prefill totals (tokens and seconds from its timings) for a
model served on the CPU; the planner then bounds a CPU context by the measured rate instead
of the estimate from the model's size. One JSON file in the data folder, keyed by the model
file's name and size (a copy elsewhere is the same model; a changed file is another).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.paths import Paths

MIN_TOKENS = 2048
"""A rate is kept once this many prompt tokens were read: fewer say little about a long read."""
REWRITE_EVERY_TOKENS = 4096
"""Later measurements rewrite the file after this many more tokens (not on every sample)."""


@dataclass(frozen=True)
class PrefillRate:
    tokens: int
    seconds: float
    cores: int
    at: str

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def _file(paths: Paths) -> Path:
    return paths.data_dir / "prefill-rates.json"


def model_key(model_path: Path) -> str:
    return f"{model_path.name}:{model_path.stat().st_size}"


def _load(paths: Paths) -> dict[str, dict[str, object]]:
    try:
        data = json.loads(_file(paths).read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def measured(paths: Paths, model_path: Path, cores: int) -> PrefillRate | None:
    """The rate measured for this model on this many cores, if there is one."""
    try:
        entry = _load(paths).get(model_key(model_path))
        rate = PrefillRate(**entry) if isinstance(entry, dict) else None  # type: ignore[arg-type]
    except (OSError, TypeError):
        return None
    if rate is None or rate.cores != cores or rate.tokens < MIN_TOKENS or rate.seconds <= 0:
        return None
    return rate


def record(paths: Paths, model_path: Path, tokens: int, seconds: float, cores: int) -> None:
    data = _load(paths)
    data[model_key(model_path)] = asdict(
        PrefillRate(tokens, round(seconds, 3), cores, time.strftime("%Y-%m-%dT%H:%M:%S"))
    )
    paths.ensure(paths.data_dir)
    write_text_atomic(_file(paths), json.dumps(data, indent=2), durable=False)


class Recorder:
    """Feeds one CPU run's cumulative prefill totals into the file, now and then."""

    def __init__(self, paths: Paths, model_path: Path, cores: int) -> None:
        self.paths, self.model_path, self.cores = paths, model_path, cores
        self.written_tokens = 0

    def observe(self, tokens_total: int, seconds_total: float) -> None:
        if tokens_total < MIN_TOKENS:
            return
        if self.written_tokens and tokens_total - self.written_tokens < REWRITE_EVERY_TOKENS:
            return
        try:
            record(self.paths, self.model_path, tokens_total, seconds_total, self.cores)
        except OSError:
            return  # a measurement is worth a retry on the next sample, not a crash
        self.written_tokens = tokens_total
