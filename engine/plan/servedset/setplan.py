"""A served set's plan as a value: its members as the user named them, one launch plan each,
and how many may be loaded at once."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lucebox.engine.core.errors import GuardRefusal, UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.machine.budget import GpuBudget
from lucebox.engine.models.presets import Preset, load_presets
from lucebox.engine.plan.launchplan import LaunchPlan
from lucebox.engine.plan.sidemodels import NO_SIDES, SidePlan


@dataclass(frozen=True)
class Member:
    """One model of the set as the user named it: a preset id or a model source."""

    source: str
    preset: Preset | None


@dataclass(frozen=True)
class SetPlan:
    """The plan of a served set: one launch plan per model and how many load at once."""

    launches: tuple[LaunchPlan, ...]
    models_max: int
    """How many models may be loaded at once; any that many fit together."""
    budget: GpuBudget
    reasons: dict[str, str]
    refusal: GuardRefusal | None = None
    process_bytes: int = 0
    """What each model's own process holds beyond its plan (and the router's, once)."""
    sides: SidePlan = NO_SIDES
    """The embedding and reranker models beside the set (:mod:`setsides`)."""

    @property
    def fits(self) -> bool:
        return self.refusal is None

    @property
    def aliases(self) -> tuple[str, ...]:
        return tuple(launch.alias for launch in self.launches)

    def to_json(self) -> dict[str, Any]:
        """The document `plan --json` prints for a set."""
        return {
            "models": [launch.to_json() for launch in self.launches],
            "models_max": self.models_max,
            "fits": self.fits,
            "reasons": dict(self.reasons),
            "device": self.budget.device,
            "process_bytes": self.process_bytes,
            "refusal": str(self.refusal) if self.refusal else None,
            **({"side_models": self.sides.to_json()} if self.sides.models else {}),
        }


class SetRefusal(GuardRefusal):
    """A set that must not start; carries its plan so `plan` can still print it."""

    def __init__(self, planned: SetPlan, refusal: GuardRefusal) -> None:
        super().__init__(refusal.message, hint=refusal.hint, problem_codes=refusal.problem_codes)
        self.planned = planned


def members_of(paths: Paths, sources: tuple[str, ...]) -> tuple[Member, ...]:
    """Each name as a preset (a preset id that is not a file here) or a model source."""
    by_id = {preset.id: preset for preset in load_presets(paths)}
    members = tuple(
        Member(s, None if Path(s).expanduser().exists() else by_id.get(s)) for s in sources
    )
    if len(set(sources)) != len(sources):
        twice = sorted({s for s in sources if sources.count(s) > 1})
        raise UsageError(f"the set names {', '.join(twice)} twice", hint="name each model once")
    return members


SET_REASONS = ("device", "split")
"""The reasons the set adds to a member's plan (where it runs); a re-plan of it keeps them."""


def with_reason(launch: LaunchPlan, key: str, why: str) -> LaunchPlan:
    """``launch`` with the set's ``why`` under ``key`` among its plan's reasons."""
    return launch.with_plan(replace(launch.plan, reasons={**launch.plan.reasons, key: why}))


def checked_set(
    launches: tuple[LaunchPlan, ...], models_max: int, budget: GpuBudget, reasons: dict[str, str]
) -> SetPlan:
    """The set of ``launches``, refused as a usage error where two share an alias (the router
    tells models apart by alias)."""
    aliases = [launch.alias for launch in launches]
    twice = sorted({a for a in aliases if aliases.count(a) > 1})
    if twice:
        raise UsageError(
            f"two models of the set are both called {', '.join(twice)}",
            hint="rename one of the files (the alias is the file name without .gguf)",
        )
    return SetPlan(launches, models_max, budget, reasons)
