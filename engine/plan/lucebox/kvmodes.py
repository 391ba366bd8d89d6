"""The long-context modes of a Lucebox launch, measured on this card and shown (pure, and their
section of the measurement store).

The exact cache at each KV type and a KVFlash pool trade speed against exactness, and which
wins depends on the card, the model and the prompt length: on an H200 the exact q8_0 cache
decoded 566 tok/s at a 64K prompt where a KVFlash pool decoded 748, and alike at 8K. So a
launch whose context is long measures every mode the planner can serve at that context (the
exact cache at each KV type that fits, a KVFlash pool at each type) over the probe set plus one
long probe, and `plan`, `status` and the dashboard show each mode's speed and what it gives up.

The measurement never changes what serves: a lossy mode (a KVFlash pool's sparse attention, a
coarser KV type) runs only where nothing exact gives the context asked for, or when the user pins
it (``--kv-mode``); the numbers are there so that choice is made knowingly.

The probes send the sampling the front's requests got, as the speculation and engine
calibrations' do, and each sampling's modes are stored apart (greedy keys as before).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from lucebox.engine.core.paths import Paths
from lucebox.engine.plan.lucebox.kvmodeview import ModeView
from lucebox.engine.plan.speculation import measurements
from lucebox.engine.plan.speculation.measurements import ProbeRate

KvTrialMode = Literal["exact", "kvflash"]
SECTION = "kv_modes"
LONG_CTX_TOKENS = 32_768
"""A launch whose context is at least this long measures its long-context modes: below it the
modes decode alike (8K on the H200: within 2%)."""
LONG_PROBE = "long"
LONG_PROBE_CAP_TOKENS = 65_536
"""The long probe's prompt: half the context, at most this (a 64K prompt already separates the
modes, and a longer one costs minutes of prefill per mode on a home card)."""
KV_TYPE_LOSS = {
    "f16": "nothing (f16 KV)",
    "q8_0": "almost nothing (8-bit KV)",
    "q4_0": "a little precision (4-bit KV)",
}


@dataclass(frozen=True)
class KvTrial:
    """One long-context mode: the cache kind and its KV type."""

    kv_mode: KvTrialMode
    kv_type: str

    @property
    def label(self) -> str:
        return f"{self.kv_mode} {self.kv_type}"


def trials_for(kv_types: Sequence[str]) -> tuple[KvTrial, ...]:
    """Every mode to try, exact ones first: the planner refuses those that do not fit."""
    exact = tuple(KvTrial("exact", t) for t in kv_types)
    return exact + tuple(KvTrial("kvflash", t) for t in kv_types)


def served_label(kv_type: str, pool_tokens: int | None) -> str:
    """The label of the mode a memory plan serves."""
    return KvTrial("kvflash" if pool_tokens else "exact", kv_type).label


def long_probe_tokens(ctx: int) -> int:
    return min(ctx // 2, LONG_PROBE_CAP_TOKENS)


def gives_up(label: str, pool_tokens: int | None) -> str:
    """What a mode gives up against an exact f16 cache, in words a user can weigh."""
    mode, _, kv_type = label.partition(" ")
    loss = KV_TYPE_LOSS.get(kv_type, f"{kv_type} KV")
    if mode != "kvflash":
        return loss
    pool = f"a {pool_tokens:,}-token pool" if pool_tokens else "a pool"
    return f"exactness: sparse attention over {pool} (may miss a detail far back); {loss}"


@dataclass(frozen=True)
class ModeRate:
    """One mode's probes on this card."""

    label: str
    pool_tokens: int | None
    probes: tuple[ProbeRate, ...]
    at: float

    @property
    def long(self) -> ProbeRate | None:
        return next((p for p in self.probes if p.name == LONG_PROBE), None)

    @property
    def short_tok_s(self) -> float:
        """Decode over the short probes, token-weighted."""
        short = [p for p in self.probes if p.name != LONG_PROBE]
        seconds = sum(p.decode_s for p in short)
        return sum(p.tokens for p in short) / seconds if seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "pool_tokens": self.pool_tokens,
            "probes": [vars(p) for p in self.probes],
            "at": self.at,
        }

    @classmethod
    def from_json(cls, label: str, data: Any) -> ModeRate | None:
        if not isinstance(data, dict) or not isinstance(data.get("probes"), list):
            return None
        try:
            probes = tuple(ProbeRate.from_json(p) for p in data["probes"])
            at = float(data["at"])
        except (AttributeError, KeyError, TypeError, ValueError):
            return None  # a damaged entry is measured again
        pool = data.get("pool_tokens")
        return cls(label, pool if isinstance(pool, int) else None, probes, at)


@dataclass(frozen=True)
class KvModes:
    """Every long-context mode measured for one launch (its files, card and context)."""

    key: str
    rates: tuple[ModeRate, ...] = ()
    refused: tuple[tuple[str, str], ...] = ()
    """Modes the planner cannot serve at this context here, and why."""

    def rate(self, label: str) -> ModeRate | None:
        return next((r for r in self.rates if r.label == label), None)

    def done(self, label: str) -> bool:
        return self.rate(label) is not None or any(name == label for name, _ in self.refused)

    def with_rate(self, rate: ModeRate) -> KvModes:
        kept = tuple(r for r in self.rates if r.label != rate.label)
        return replace(self, rates=(*kept, rate))

    def with_refused(self, label: str, why: str) -> KvModes:
        kept = tuple(r for r in self.refused if r[0] != label)
        return replace(self, refused=(*kept, (label, why)))

    def to_json(self) -> dict[str, Any]:
        return {
            "rates": {r.label: r.to_json() for r in self.rates},
            "refused": dict(self.refused),
        }

    @classmethod
    def from_json(cls, key: str, data: Any) -> KvModes | None:
        if not isinstance(data, dict):
            return None
        stored = data.get("rates")
        rates = tuple(
            found
            for label, value in (stored.items() if isinstance(stored, dict) else ())
            if (found := ModeRate.from_json(str(label), value)) is not None
        )
        refused = data.get("refused")
        pairs = refused.items() if isinstance(refused, dict) else ()
        return cls(key, rates, tuple((str(label), str(why)) for label, why in pairs))


def views(modes: KvModes, serving: str) -> tuple[ModeView, ...]:
    """Each measured mode, the one serving first, then the fastest at the long probe."""

    def view(rate: ModeRate) -> ModeView:
        long = rate.long
        return ModeView(
            rate.label,
            rate.label == serving,
            rate.short_tok_s,
            long.tok_s if long is not None else None,
            long.prompt_tokens if long is not None else None,
            long.prefill_s if long is not None else None,
            gives_up(rate.label, rate.pool_tokens),
        )

    shown = [view(r) for r in modes.rates]
    return tuple(sorted(shown, key=lambda v: (not v.serving, -(v.long_tok_s or v.short_tok_s))))


def launch_key(key: measurements.MeasurementKey) -> str:
    """The store's key: the files, the engine build, the card, the context asked for (the
    KV type is what the modes vary) and the sampling the probes send."""
    parts = [key.model, key.draft or "-", key.engine, key.card, str(key.ctx)]
    return at_sampling(" | ".join(parts), key.sampling)


_LAUNCH_PARTS = 5
"""The parts of a launch key before its sampling."""


def at_sampling(key: str, sampling: str) -> str:
    """``key`` for replies at ``sampling``: greedy keys read as before sampling was kept."""
    return measurements.at_sampling(key, sampling, _LAUNCH_PARTS)


def read_modes(paths: Paths, key: str) -> KvModes | None:
    return KvModes.from_json(key, measurements.read_section(paths, SECTION).get(key))


def write_modes(paths: Paths, modes: KvModes) -> None:
    measurements.write_entry(paths, SECTION, modes.key, modes.to_json())


@dataclass(frozen=True)
class KvModesPlan:
    """A long-context launch's modes: what to measure, what serves, what was measured."""

    key: str
    trials: tuple[KvTrial, ...]
    serving: str
    long_tokens: int
    measured: tuple[ModeView, ...] = ()
    unmeasured: tuple[str, ...] = ()
    refused: tuple[tuple[str, str], ...] = ()

    def lines(self) -> list[str]:
        """What `plan` prints: each measured mode, then what is still to measure."""
        shown = [view.text() for view in self.measured]
        if self.unmeasured:
            shown.append(
                f"unmeasured: {', '.join(self.unmeasured)} (measured once the server is idle, "
                f"with a {self.long_tokens:,}-token probe; what serves does not change)"
            )
        return shown

    def to_json(self) -> dict[str, Any]:
        return {
            "serving": self.serving,
            "measured": [view.to_json() for view in self.measured],
            "unmeasured": list(self.unmeasured),
            "cannot_serve": dict(self.refused),
            "long_probe_tokens": self.long_tokens,
        }


def plan_modes(
    paths: Paths, key: str, kv_types: Sequence[str], serving: str, ctx: int
) -> KvModesPlan:
    """The modes of a launch serving ``serving`` at ``ctx`` tokens, with what the store holds."""
    trials = trials_for(kv_types)
    found = read_modes(paths, key) or KvModes(key)
    return KvModesPlan(
        key,
        trials,
        serving,
        long_probe_tokens(ctx),
        views(found, serving),
        tuple(t.label for t in trials if not found.done(t.label)),
        found.refused,
    )
