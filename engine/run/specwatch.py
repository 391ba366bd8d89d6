"""The speculation guard of the single server (a served set's is in :mod:`servedsetguard`).

The run feeds its :class:`SpecGuard` each sample's drafted and accepted totals and the requests
that finished since the last one; a decision (shorter drafts, or none) waits until the engine
runs no request, since the engine has no per-request switch. The run applies it (one restart);
this module holds only the state and the step, pure.

Greedy and sampled replies are judged apart only as far as the engines' logs tell them apart.
The Lucebox engine does: a sampled reply without sampled verification logs ``[ar-decode]``
(``ServedRequest.speculated`` False) and the guard judges the draft by the others; with
``DFLASH_SAMPLED_VERIFY`` both log ``[spec-decode]``. llama-server's log does not name the
sampling at its default verbosity, but each reply's timings carry its drafted and accepted
tokens, and the front counts them by the request's sampling (``status``'s sampling line shows
both acceptances). The guard judges them together there on purpose: one engine mode serves both
classes, so what decides is the acceptance over the mix as served.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from lucebox.engine.plan.speculation.specguard import Decision, RateSums, SpecGuard
from lucebox.engine.plan.speculation.workload import ServedRequest
from lucebox.engine.run.sample import Sample, SpecStatus


@dataclass(frozen=True)
class SpecWatch:
    """One server's speculation guard and what it decided (pure state)."""

    guard: SpecGuard | None = None
    """Watches the acceptance; None when nothing speculates (or it was switched off)."""
    asked: bool = False
    """The user chose the mode (--spec or model.spec): a guard decision only warns."""
    pending: Decision | None = None
    """A decision waiting for an idle moment (or, when asked, the warning status shows)."""
    off: SpecStatus | None = None
    """Speculation as planned, switched off by the guard: shown instead of the sampler's."""
    engine_pid: int | None = None
    """The engine process whose counters the guard's window was last fed."""

    def serving(self, guard: SpecGuard | None) -> SpecWatch:
        """The watch of a launch the calibration chose, by ``guard``: nothing decided yet."""
        return replace(self, guard=guard, pending=None, off=None)

    def view(self, sampled: SpecStatus | None) -> SpecStatus | None:
        """The sampler's view of speculation: the guard's switch-off when it switched it off,
        with the guard's warning when it only warns."""
        if self.off is not None:
            return self.off
        pending = self.pending
        if sampled is None or pending is None or not self.asked:
            return sampled
        return replace(sampled, reason=f"{pending.observed}; kept, as --spec asked: it costs speed")


def step(
    watch: SpecWatch,
    sample: Sample,
    requests: Sequence[ServedRequest],
    engine_pid: int,
    *,
    applies: bool,
    spec_type: str | None,
) -> tuple[SpecWatch, Decision | None]:
    """The guard fed one sample of engine ``engine_pid`` (speculating with ``spec_type``) and
    the requests finished since the last one; the decision to apply now, if any: only when
    the run ``applies`` decisions, the user did not choose the mode and no request runs."""
    guard = watch.guard
    if guard is None:
        return watch, None
    if engine_pid != watch.engine_pid:
        # A new engine counts from zero: a burst before its first sample could pass the
        # old window's start and read as a negative acceptance.
        guard = replace(guard, drafted_at_start=0, accepted_at_start=0, window=RateSums())
    pending = watch.pending
    if pending is None and sample.draft_tokens_total is not None:
        guard, pending = guard.judge(sample.draft_tokens_total, sample.accepted_tokens_total or 0)
    if pending is None:
        guard, pending = guard.judge_rate(requests, sample.draft_tokens_total or 0)
    watch = replace(watch, guard=guard, pending=pending, engine_pid=engine_pid)
    if pending is None or watch.asked or not applies:
        return watch, None
    if sample.slots_busy != 0:
        return watch, None  # the engine has no per-request switch: wait for an idle moment
    watch = replace(watch, pending=None)
    if pending.action == "off":
        off = SpecStatus(spec_type or "", False, pending.reason, pending.acceptance, None)
        watch = replace(watch, guard=None, off=off)
    return watch, pending
