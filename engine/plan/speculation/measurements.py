"""The measurement store: what each speculation did to decode speed on this card. Its file also
holds sections read and written through :func:`read_section`: how fast this PC's CPU reads
prompts per model (plan/prefillrates.py) and the two-card placements (plan/placementrates.py).

One small JSON file in the data dir, one entry per (model file, draft file, engine build, card,
context, KV type): the token-weighted decode rate of every configuration the calibration
measured there, no speculation included, and the speculation the guard switched off while
serving (so a restart does not serve it again). The planner reads it to choose, `status` and
the dashboard to show what speculation gains or costs, `bench` to compare; the calibration
writes it, one configuration at a time, so an interrupted calibration resumes where it was.
The ``engines`` section keeps each engine's measured rates per launch that both engines can
serve (plan/engineverdict.py).

The version moves with the shape: an older store is read (keys added since read as absent),
a newer one is refused, for reading and writing alike, rather than rewritten without the
fields this version does not know.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lucebox.engine.core.atomic import write_text_atomic
from lucebox.engine.core.errors import LuceboxError
from lucebox.engine.core.paths import Paths
from lucebox.engine.models.records import list_models
from lucebox.engine.plan.samplingdefaults import GREEDY
from lucebox.engine.plan.speculation.speculation import SpecCandidate
from lucebox.engine.plan.speculation.spread import spread
from lucebox.engine.plan.speculation.workload import ProbeShape, RateCurve, probe_mix

STORE_NAME = "spec-measurements.json"
STORE_VERSION = 2
"""2: probes keep their prefill seconds, entries the guard's switch-offs, and the ``engines``
section exists. A new section (``kv_modes``, plan/lucebox/kvmodes.py) does not move it: a writer
keeps the sections it does not know, so an older lucebox neither drops it nor needs to refuse."""
IDENTITY_BYTES = 1 << 20
"""A model file is known by its name, size and the hash of its first MiB (header and
metadata): hashing a 15 GB file at every start would cost a minute."""
OFF = "off"
"""The label of the configuration without speculation: the baseline."""


def store_file(paths: Paths) -> Path:
    return paths.data_dir / STORE_NAME


def file_identity(path: Path, paths: Paths | None = None) -> str:
    """``name:size:hash`` of a model file; the name alone when it cannot be read.

    The hash is of the sha256 of every file the store recorded for the model ``path`` is the
    main file of (with ``paths``): a new revision differs wherever its bytes do, in any shard,
    and costs no read. A file the store does not know is hashed by its first MiB."""
    try:
        size = path.stat().st_size
        recorded = _recorded_sha256s(paths, path) if paths is not None else None
        if recorded is None:
            with path.open("rb") as handle:
                recorded = handle.read(IDENTITY_BYTES)
    except OSError:
        return path.name
    return f"{path.name}:{size}:{hashlib.sha256(recorded).hexdigest()[:16]}"


def _recorded_sha256s(paths: Paths, path: Path) -> bytes | None:
    main = path.resolve()
    for record in list_models(paths):
        if record.main_path.resolve() == main and all(f.sha256 for f in record.files):
            return " ".join(f.sha256 for f in record.files).encode()
    return None


def config_label(spec_type: str | None, draft_max: int | None, p_min: float | None) -> str:
    """One speculation configuration as a short stable name (``draft-mtp n3 p0.75``)."""
    if spec_type is None:
        return OFF
    parts = [spec_type]
    if draft_max is not None:
        parts.append(f"n{draft_max}")
    if p_min is not None:
        parts.append(f"p{p_min:g}")
    return " ".join(parts)


@dataclass(frozen=True)
class MeasurementKey:
    """What a measurement holds for: another file, build, card, context or KV type may differ."""

    model: str
    draft: str | None
    engine: str
    card: str
    ctx: int
    kv: str
    sampling: str = GREEDY
    """The sampling the probes sent (plan/samplingdefaults.py ``label``): ``greedy`` or
    ``t0.7``; greedy and sampled rates are stored apart."""

    def text(self) -> str:
        parts = [self.model, self.draft or "-", self.engine, self.card, str(self.ctx), self.kv]
        return at_sampling(" | ".join(parts), self.sampling, len(parts))


def at_sampling(key: str, sampling: str, parts: int) -> str:
    """A store key of ``parts`` parts (``key``'s first, any sampling it had dropped) for
    replies at ``sampling``: a greedy key reads as before sampling was recorded, so its
    entries stay valid."""
    kept = key.split(" | ")[:parts]
    return " | ".join(kept if sampling == GREEDY else [*kept, sampling])


@dataclass(frozen=True)
class ProbeRate:
    """One probe's reply: tokens decoded and the engine's decode seconds for them."""

    name: str
    tokens: int
    decode_s: float
    drafted: int = 0
    accepted: int = 0
    weight: int = 0
    """Tokens the probe asked for: its share of the rate, the same whatever configuration (a
    speculating engine's numerics differ a little, so its reply may end sooner or later)."""
    prompt_tokens: int = 0
    """The whole prompt the reply decoded after (the engine's prompt_n + cache_n); 0 in
    entries stored before it was kept."""
    prefill_s: float = 0.0
    """Seconds the engine took to read the prompt (its time to first token, less the HTTP
    round trip); 0 in entries stored before it was kept."""

    @property
    def tok_s(self) -> float:
        return self.tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def asked(self) -> int:
        """Its weight in the probes' own mix: the tokens it asked for, else those decoded."""
        return self.weight or self.tokens

    @classmethod
    def from_json(cls, data: Any) -> ProbeRate:
        """One stored probe; keys this version does not know are left out."""
        known = set(cls.__dataclass_fields__)
        return cls(**{key: value for key, value in data.items() if key in known})


@dataclass(frozen=True)
class TrialRate:
    """One configuration measured over the probe set."""

    label: str
    spec_type: str | None
    draft_max: int | None
    p_min: float | None
    probes: tuple[ProbeRate, ...]
    at: float
    repeats: tuple[tuple[ProbeRate, ...], ...] = ()
    """The probe set's earlier runs of this configuration, kept where a verdict needed its
    run-to-run spread (plan/engineverdict.py, run/calibrate/calibration.py)."""

    def runs(self) -> tuple[tuple[ProbeRate, ...], ...]:
        """Every run of the probe set, the latest first."""
        return (self.probes, *self.repeats)

    def with_run(self, later: TrialRate) -> TrialRate:
        """This configuration with ``later``'s run added (the latest first). A run of another
        configuration (the speculation verdict changed between the runs) starts afresh: the
        runs' spread is the noise of one configuration, not the gap between two."""
        if self.configuration() != later.configuration():
            return later
        return replace(later, repeats=self.runs())

    def configuration(self) -> tuple[str, str | None, int | None, float | None]:
        """What was measured: the mode and its settings, apart from when and how fast."""
        return (self.label, self.spec_type, self.draft_max, self.p_min)

    @property
    def tokens(self) -> int:
        return sum(p.tokens for p in self.probes)

    @property
    def tok_s(self) -> float:
        """Token-weighted decode rate over the probes, each weighted by the tokens it asked
        for (its ``weight``), so every configuration is judged on the same mix; probes without
        a weight count the tokens they decoded."""
        return self.rate_for({p.name: p.asked for p in self.probes})

    def rate_for(self, mix: Mapping[str, float]) -> float:
        """Decode rate over the probes, each weighted by its share in ``mix``."""
        timed = [p for p in self.probes if p.tok_s > 0 and mix.get(p.name, 0) > 0]
        seconds = sum(mix[p.name] / p.tok_s for p in timed)
        return sum(mix[p.name] for p in timed) / seconds if seconds > 0 else 0.0

    def shapes(self) -> tuple[ProbeShape, ...]:
        """The probes as the served requests are matched against them."""
        return tuple(
            ProbeShape(p.name, p.prompt_tokens, p.tokens, p.tok_s, p.asked) for p in self.probes
        )

    @property
    def drafted(self) -> int:
        return sum(p.drafted for p in self.probes)

    @property
    def accepted(self) -> int:
        return sum(p.accepted for p in self.probes)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "spec_type": self.spec_type,
            "draft_max": self.draft_max,
            "p_min": self.p_min,
            "tok_s": round(self.tok_s, 2),
            "probes": [vars(p) for p in self.probes],
            "at": self.at,
            **(
                {"repeats": [[vars(p) for p in run] for run in self.repeats]}
                if self.repeats
                else {}
            ),
        }

    @classmethod
    def from_json(cls, data: Any) -> TrialRate | None:
        if not isinstance(data, dict) or not isinstance(data.get("label"), str):
            return None
        try:
            probes = tuple(ProbeRate.from_json(p) for p in data.get("probes") or [])
            repeats = tuple(
                tuple(ProbeRate.from_json(p) for p in run) for run in data.get("repeats") or []
            )
            return cls(
                data["label"],
                data.get("spec_type"),
                data.get("draft_max"),
                data.get("p_min"),
                probes,
                float(data.get("at") or 0.0),
                repeats,
            )
        except (TypeError, AttributeError):
            return None


@dataclass(frozen=True)
class Measurement:
    """Every configuration measured for one key, and the verdict once the set is complete."""

    key: MeasurementKey
    trials: tuple[TrialRate, ...] = ()
    chosen: str | None = None
    """The label that serves under ``--spec auto``; None until the calibration has finished."""
    why: str = ""
    mix: tuple[tuple[str, float], ...] = ()
    """The share of each probe that rates are weighed by: the served mix the last re-measure
    was for; empty for the probes' own mix (each by the tokens it asks for)."""
    remeasure_at: float = 0.0
    """Unix time the served mix moved away from ``mix``: trials measured before it are due
    again; 0 when none is."""
    remeasure_why: str = ""
    guard_off: tuple[tuple[str, str], ...] = ()
    """(label, why) of each configuration the speculation guard switched off while serving:
    it stays off across restarts until the served mix moves (a re-measure clears it)."""

    def switched_off(self, spec_type: str) -> str | None:
        """Why the guard switched a configuration of ``spec_type`` off while serving; None when
        it did not."""
        return next((why for off, why in self.guard_off if off.split()[0] == spec_type), None)

    def with_guard_off(self, label: str, why: str) -> Measurement:
        kept = tuple(item for item in self.guard_off if item[0] != label)
        return replace(self, guard_off=(*kept, (label, why)))

    def trial(self, label: str) -> TrialRate | None:
        return next((t for t in self.trials if t.label == label), None)

    def fresh(self, label: str) -> bool:
        """Whether ``label`` was measured and is not due again."""
        trial = self.trial(label)
        return trial is not None and trial.at >= self.remeasure_at

    def rate(self, trial: TrialRate) -> float:
        """``trial``'s decode rate over the mix this measurement is weighed by: the mean over
        its runs of the probe set."""
        rates = self._run_rates(trial)
        return sum(rates) / len(rates)

    def _run_rates(self, trial: TrialRate) -> list[float]:
        """``trial``'s decode rate in each of its runs, over the mix weighed by."""
        mix = dict(self.mix)
        return [
            run_trial.rate_for(mix) if mix else run_trial.tok_s
            for run_trial in (replace(trial, probes=run, repeats=()) for run in trial.runs())
        ]

    def rate_spread(self, label: str) -> tuple[float, int]:
        """How far ``label``'s rate spreads over its runs of the probe set (highest less lowest
        over their mean), and how many runs; (0.0, 1) with one run or none."""
        trial = self.trial(label)
        rates = self._run_rates(trial) if trial is not None else []
        return (spread(rates), len(rates)) if len(rates) > 1 else (0.0, 1)

    def weighed_mix(self) -> dict[str, float]:
        """The probe shares the rates are weighed by now."""
        base = self.baseline
        return dict(self.mix) if self.mix else probe_mix(base.shapes() if base else ())

    def baseline_curve(self) -> RateCurve | None:
        """The rate without speculation by prompt length; None before it was measured."""
        base = self.baseline
        if base is None or self.rate(base) <= 0:
            return None
        return RateCurve.of(base.shapes(), self.rate(base))

    def remeasure(self, mix: Mapping[str, float], why: str, at: float) -> Measurement:
        """Every configuration due again, its rates to be weighed by the served ``mix``; the
        verdict stands (and serves) until the re-measure replaces it."""
        return replace(
            self,
            mix=tuple(sorted(mix.items())),
            remeasure_at=at,
            remeasure_why=why,
            guard_off=(),
        )

    @property
    def baseline(self) -> TrialRate | None:
        return self.trial(OFF)

    def with_trial(self, trial: TrialRate) -> Measurement:
        """``trial`` kept, in the place of the one of its label measured before."""
        if self.trial(trial.label) is None:
            return replace(self, trials=(*self.trials, trial))
        return replace(
            self, trials=tuple(trial if t.label == trial.label else t for t in self.trials)
        )

    def ratio(self, label: str) -> float | None:
        """``label``'s decode rate over the rate without speculation; None before both ran."""
        base, trial = self.baseline, self.trial(label)
        if base is None or trial is None or self.rate(base) <= 0:
            return None
        return self.rate(trial) / self.rate(base)

    def ratio_spread(self, label: str) -> tuple[float, int]:
        """How far ``label``'s speed-up spreads over its runs of the probe set (each against
        the same rate without speculation): the runs' highest less lowest rate over their mean,
        and how many runs; (0.0, 1) with one run."""
        base = self.baseline
        if base is None or self.rate(base) <= 0:
            return 0.0, 1
        return self.rate_spread(label)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": vars(self.key),
            "trials": [t.to_json() for t in self.trials],
            "chosen": self.chosen,
            "why": self.why,
            "mix": dict(self.mix),
            "remeasure_at": self.remeasure_at,
            "remeasure_why": self.remeasure_why,
            "guard_off": dict(self.guard_off),
        }

    @classmethod
    def from_json(cls, data: Any) -> Measurement | None:
        if not isinstance(data, dict) or not isinstance(data.get("key"), dict):
            return None
        try:
            key = MeasurementKey(**data["key"])
        except TypeError:
            return None
        trials = [TrialRate.from_json(t) for t in data.get("trials") or []]
        chosen = data.get("chosen")
        mix = data.get("mix")
        shares = mix.items() if isinstance(mix, dict) else ()
        off = data.get("guard_off")
        switched = off.items() if isinstance(off, dict) else ()
        return cls(
            key,
            tuple(t for t in trials if t is not None),
            chosen if isinstance(chosen, str) else None,
            str(data.get("why") or ""),
            tuple(sorted((str(n), float(v)) for n, v in shares if isinstance(v, int | float))),
            float(data.get("remeasure_at") or 0.0),
            str(data.get("remeasure_why") or ""),
            tuple((str(label), str(why)) for label, why in switched),
        )


class StoreVersionError(LuceboxError):
    """The measurement store was written by a newer lucebox, in a shape this one cannot keep."""


def _read_document(paths: Paths) -> dict[str, Any]:
    """The whole store; {} when there is none or it is unreadable. Raises
    :class:`StoreVersionError` for a store of a newer version."""
    path = store_file(paths)
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    version = data.get("version")
    if isinstance(version, int) and version > STORE_VERSION:
        raise StoreVersionError(
            f"the measurement store {path} is version {version}, written by a newer lucebox; "
            f"this one reads up to version {STORE_VERSION} and would lose what it does not know",
            hint=f"run the newer lucebox, or move {path.name} aside to measure again",
        )
    if not isinstance(version, int) or version < 1:
        return {}
    return data


def read_section(paths: Paths, name: str) -> dict[str, Any]:
    found = _read_document(paths).get(name)
    return found if isinstance(found, dict) else {}


def write_section(paths: Paths, name: str, section: dict[str, Any]) -> None:
    """Keep ``section`` under ``name``, the other sections as they are."""
    document = {**_read_document(paths), "version": STORE_VERSION, name: section}
    paths.ensure(paths.data_dir)
    write_text_atomic(store_file(paths), json.dumps(document, indent=1))


def write_entry(paths: Paths, name: str, key: str, entry: dict[str, Any]) -> None:
    """Keep ``entry`` under ``key`` in the section ``name``, the rest as it is."""
    section = read_section(paths, name)
    section[key] = entry
    write_section(paths, name, section)


def _read_all(paths: Paths) -> dict[str, Any]:
    return read_section(paths, "entries")


def read_measurement(paths: Paths, key: MeasurementKey) -> Measurement | None:
    """What the store holds for ``key``; None when nothing was measured (or the file is bad)."""
    return Measurement.from_json(_read_all(paths).get(key.text()))


def write_measurement(paths: Paths, measurement: Measurement) -> None:
    """Keep ``measurement`` under its key, leaving the other keys as they are."""
    entries = _read_all(paths)
    entries[measurement.key.text()] = measurement.to_json()
    write_section(paths, "entries", entries)


def key_for(
    target: Path,
    draft: Path | None,
    engine: str,
    card: str,
    ctx: int,
    kv: str,
    paths: Paths | None = None,
    sampling: str = GREEDY,
) -> MeasurementKey:
    return MeasurementKey(
        file_identity(target, paths),
        file_identity(draft, paths) if draft is not None else None,
        engine,
        card,
        ctx,
        kv,
        sampling,
    )


def measured_choice(
    found: list[SpecCandidate], measurement: Measurement | None
) -> list[SpecCandidate] | None:
    """The candidates narrowed to what the measurement chose (empty: none is fastest); None
    when there is no verdict, or the chosen mode is not possible any more."""
    if measurement is None:
        return None
    if found and measurement.switched_off(found[0].spec_type) is not None:
        return []  # the guard switched what would serve off while serving: it stays off
    if measurement.chosen is None:
        return None
    if measurement.chosen == OFF:
        return []
    trial = measurement.trial(measurement.chosen)
    match = [c for c in found if trial is not None and c.spec_type == trial.spec_type]
    if trial is None or not match:
        return None
    why = f"{match[0].why}; served as {trial.label}: {measurement.why}"
    return [replace(match[0], draft_max=trial.draft_max, p_min=trial.p_min, why=why)]
