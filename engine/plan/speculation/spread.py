"""A verdict's run-to-run spread (pure): how far one candidate's runs of the probe set differ,
what a switch must win by once that is known, and when two candidates are too close for their
runs so far to tell apart.

Two runs of one launch differ (warm-up, clocks, a busy machine), so a verdict between two close
candidates runs both again and switches only when it wins by more than their spread. The engine
verdict (plan/engineverdict.py) and the speculation verdict (run/calibrate/calibration.py) each
keep a :class:`RepeatRule` of their own margins.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


def spread(figures: Sequence[float]) -> float:
    """Highest less lowest of one candidate's ``figures`` (one a run) over their mean; 0 with
    one run."""
    if len(figures) < 2:
        return 0.0
    mean = sum(figures) / len(figures)
    return (max(figures) - min(figures)) / mean if mean > 0 else 0.0


@dataclass(frozen=True)
class RepeatRule:
    """When a verdict between two candidates stands, and what a switch must win by."""

    tie_margin: float
    """A switch must win by more than this share even where the runs agree."""
    unsure_gap: float
    """After one run each, candidates closer than this share run again."""
    max_runs: int
    """Runs of the probe set per candidate at most."""

    def margin(self, spreads: Iterable[float]) -> float:
        """What a switch must win by: the tie margin, or the candidates' widest runs' spread
        where that is wider."""
        return max(self.tie_margin, *spreads)

    def within(self, spreads: Iterable[float]) -> str:
        """The margin a near tie fell within, as a verdict says it (``the 5% tie margin``,
        ``the 8% runs' spread``)."""
        margin = self.margin(spreads)
        kind = "tie margin" if margin == self.tie_margin else "runs' spread"
        return f"the {margin:.0%} {kind}"

    def needs_another_run(self, gap: float, runs: Sequence[int], spreads: Iterable[float]) -> bool:
        """Whether two candidates ``gap`` apart (a share of the slower) both run the probes
        again: closer than ``unsure_gap`` while one has run once, or than their margin after
        more, and neither has run ``max_runs`` times."""
        if max(runs) >= self.max_runs:
            return False
        if min(runs) < 2:
            return gap < self.unsure_gap
        return gap < self.margin(spreads)
