"""The speculation guard of a served set's models (the single server's is in specwatch).

Each model whose plan speculates (and whose mode lucebox chose) has its own
:class:`SpecGuard`, fed from its own process's ``/metrics`` counters, which start from zero in
each process the router loads. A decision waits until that process runs no request; the run
then plans the model again (shorter drafts, or none); the router, re-reading its preset file,
stops that model's process alone and loads it with the new flags on the next request. The
other models run on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from lucebox.engine.plan.speculation.specguard import Decision, SpecGuard
from lucebox.engine.run.sample import SpecStatus
from lucebox.engine.run.servedset.servedsethang import ChildLook

DRAFTED = "spec_decode_num_draft_tokens_total"
ACCEPTED = "spec_decode_num_accepted_tokens_total"


@dataclass(frozen=True)
class ModelSpec:
    """What the set's plan says of one model's speculation."""

    spec_type: str | None
    draft_max: int | None
    reason: str
    guarded: bool
    """lucebox chose the mode (``--spec auto``): the guard may change it."""
    shortened: bool = False
    """Its drafts were already shortened once: the next step is off."""


NO_SPEC = ModelSpec(None, None, "", guarded=False)


@dataclass(frozen=True)
class Watched:
    """One model's guard and the process it counts (pure state)."""

    guard: SpecGuard
    port: int | None = None
    """The process whose counters the guard's starts are from; None before the first look."""
    acceptance: float | None = None
    """Accepted / drafted tokens of that process."""
    pending: Decision | None = None
    """A decision waiting for an idle moment."""


def observe(
    watched: Watched, port: int, drafted: int, accepted: int
) -> tuple[Watched, Decision | None]:
    """The guard fed one look at a process's running totals; a new process (another port)
    counts from its own start, so only what it drafted under its flags is judged."""
    guard = watched.guard
    if port != watched.port:
        guard = replace(guard, drafted_at_start=0, accepted_at_start=0)
    acceptance = accepted / drafted if drafted > 0 else None
    if watched.pending is not None:
        return replace(watched, guard=guard, port=port, acceptance=acceptance), watched.pending
    guard, decision = guard.judge(drafted, accepted)
    return Watched(guard, port, acceptance, decision), decision


def watched_for(spec: ModelSpec, on_gpu: bool) -> Watched | None:
    """The watch of a model as planned: None when it does not speculate, or the user chose
    its mode (the guard never overrides that)."""
    if spec.spec_type is None or not spec.guarded:
        return None
    guard = SpecGuard.for_launch(spec.spec_type, spec.draft_max, on_gpu, shortened=spec.shortened)
    return Watched(guard)


def spec_status(
    spec: ModelSpec, watched: Watched | None, off: SpecStatus | None
) -> SpecStatus | None:
    """A model's speculation for `status`: the guard's switch-off this run, else the plan's
    mode with its process's acceptance."""
    if off is not None:
        return off
    if spec.spec_type is None:
        return None
    acceptance = watched.acceptance if watched is not None else None
    return SpecStatus(spec.spec_type, True, spec.reason, acceptance, None)


class ChildSpecGuard:
    """One guard per speculating model of a set; :meth:`check` after each ``/models`` poll."""

    def __init__(self, specs: dict[str, ModelSpec], on_gpu: dict[str, bool]) -> None:
        self.on_gpu = on_gpu
        self.specs: dict[str, ModelSpec] = {}
        self._watched: dict[str, Watched] = {}
        self._off: dict[str, SpecStatus] = {}
        """Models whose speculation the guard switched off in this run, as status shows them."""
        self.replanned(specs)

    def replanned(self, specs: dict[str, ModelSpec]) -> None:
        """The set's plan now: a model whose speculation changed gets a new guard, which
        counts from the last look at its process (the process with the old flags may still
        answer until it exits; the next process starts at zero)."""
        for alias, spec in specs.items():
            if self.specs.get(alias) == spec:
                continue
            before = self._watched.pop(alias, None)
            fresh = watched_for(spec, self.on_gpu.get(alias, False))
            if fresh is not None and before is not None:
                old = before.guard
                fresh = replace(
                    fresh,
                    guard=replace(
                        fresh.guard,
                        drafted_at_start=old.drafted_at_start,
                        accepted_at_start=old.accepted_at_start,
                    ),
                    port=before.port,
                )
            if fresh is not None:
                self._watched[alias] = fresh
        self.specs = dict(specs)

    def switched_off(self, alias: str, decision: Decision) -> None:
        """Remember a switch-off for status (the re-plan's reason says only "off")."""
        spec = self.specs.get(alias)
        acceptance = decision.acceptance
        if spec is not None and spec.spec_type is not None:
            self._off[alias] = SpecStatus(spec.spec_type, False, decision.reason, acceptance, None)

    def pending(self) -> frozenset[str]:
        """The models whose decision waits for an idle moment."""
        return frozenset(a for a, w in self._watched.items() if w.pending is not None)

    def status(self, alias: str) -> SpecStatus | None:
        spec = self.specs.get(alias)
        if spec is None:
            return None
        return spec_status(spec, self._watched.get(alias), self._off.get(alias))

    def check(self, looks: dict[str, ChildLook]) -> list[tuple[str, Decision]]:
        """Each looked-at model's process (by alias) fed to its guard: the decisions due now,
        each for a process that runs no request."""
        due = []
        for alias, child in looks.items():
            watched = self._watched.get(alias)
            if watched is None or child.slots is None or not child.counters:
                continue
            drafted = int(child.counters.get(DRAFTED, 0))
            accepted = int(child.counters.get(ACCEPTED, 0))
            watched, decision = observe(watched, child.port, drafted, accepted)
            if decision is not None and not child.busy:
                watched = replace(watched, pending=None)
                due.append((alias, decision))
            self._watched[alias] = watched
        return due
