"""The sampling the front's generation requests got: greedy and sampled counted apart, with the
typical temperature, for `status` and for what the calibration's probes and `bench` send.

What is recorded is the sampling the engine applies: the client's fields, or the launch's
defaults where it left them unset (the front fills them in, :mod:`lucebox.engine.run.front.
apishape`). Before any request the defaults stand in.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, Any

from lucebox.engine.plan.samplingdefaults import is_greedy, sampling_defaults
from lucebox.engine.run.sample import SamplingStatus

if TYPE_CHECKING:
    from lucebox.engine.plan.samplingdefaults import SamplingDefaults

TEMPERATURES_KEPT = 64
"""Distinct temperatures counted at most: a client sweeping them cannot grow the tally."""
PROBE_SEED = 1
"""The seed every probe sends, so sampled runs compare."""


class SamplingMix:
    """The tally of one run's front; :meth:`record` per generation request sent on."""

    def __init__(self, defaults: SamplingDefaults | None = None) -> None:
        self.defaults = defaults or sampling_defaults(None, None)
        self.greedy = 0
        self.sampled = 0
        self._temperatures: Counter[float] = Counter()
        self._drafts = {"greedy": [0, 0], "sampled": [0, 0]}
        """Draft tokens (drafted, accepted) of the replies, by their request's sampling."""

    def record(self, body: bytes) -> bool | None:
        """Count the request ``body`` as the engine gets it: whether it decodes greedily; a
        body that is not a JSON object counts nothing (None)."""
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None
        if not isinstance(doc, dict):
            return None
        temperature = _number(doc.get("temperature"), self.defaults.temperature)
        top_k = _number(doc.get("top_k"), self.defaults.top_k)
        if is_greedy(temperature, top_k):
            self.greedy += 1
            return True
        self.sampled += 1
        key = round(temperature, 2)
        if key in self._temperatures or len(self._temperatures) < TEMPERATURES_KEPT:
            self._temperatures[key] += 1
        return False

    def replied(self, greedy: bool | None, drafted: int, accepted: int) -> None:
        """A reply's draft tokens (the engine's timings), counted by its request's sampling:
        sampled replies accept fewer, and a mix of both is judged by what each gets."""
        if greedy is None or drafted <= 0:
            return
        kept = self._drafts["greedy" if greedy else "sampled"]
        kept[0] += drafted
        kept[1] += min(accepted, drafted)

    def status(self) -> SamplingStatus:
        if self.greedy == self.sampled == 0:
            temperature = 0.0 if self.defaults.greedy else self.defaults.temperature
            return SamplingStatus(0, 0, temperature, "defaults")
        typical = self._temperatures.most_common(1)
        return SamplingStatus(
            self.greedy,
            self.sampled,
            typical[0][0] if typical else 0.0,
            "clients",
            self._acceptance("greedy"),
            self._acceptance("sampled"),
        )

    def _acceptance(self, kind: str) -> float | None:
        drafted, accepted = self._drafts[kind]
        return accepted / drafted if drafted else None

    def probe_fields(self) -> dict[str, Any]:
        """The sampling a probe sends to measure at this mix: greedy when the mix is, else the
        mix's temperature with the defaults' other fields; a fixed seed either way."""
        return probe_fields(self.status(), self.defaults)


def probe_fields(mix: SamplingStatus | None, defaults: SamplingDefaults | None) -> dict[str, Any]:
    """A probe's sampling fields for ``mix`` (greedy without one)."""
    if mix is None or mix.is_greedy:
        return {"temperature": 0, "seed": PROBE_SEED}
    other = (defaults or sampling_defaults(None, None)).fields()
    return {**other, "temperature": mix.temperature, "seed": PROBE_SEED}


def client_fields(mix: SamplingStatus | None) -> dict[str, Any]:
    """A bench request's sampling for ``mix`` through lucebox's front (greedy without one): the
    temperature and a fixed seed; the front fills the launch's defaults in for the rest."""
    if mix is None or mix.is_greedy:
        return {"temperature": 0, "seed": PROBE_SEED}
    return {"temperature": mix.temperature, "seed": PROBE_SEED}


def _number(value: Any, default: float) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return float(default)
