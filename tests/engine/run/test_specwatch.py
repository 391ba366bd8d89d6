"""The single server's speculation guard: a decision waits for an idle engine, the user's own
choice of mode only warns, and a switch-off replaces the sampler's view of speculation."""

from __future__ import annotations

from lucebox.engine.plan.speculation.specguard import SpecGuard
from lucebox.engine.run.sample import Sample, SpecStatus
from lucebox.engine.run.specwatch import SpecWatch, step

NGRAM = SpecGuard.for_launch("ngram-mod", None, on_gpu=False)
SAMPLED = SpecStatus("ngram-mod", True, "ngram-mod as planned", 0.3, None)


def _sample(drafted: int, accepted: int, busy: int = 0) -> Sample:
    return Sample(
        1.0, None, None, None, None, None, None, None, None, 0, slots_busy=busy,
        draft_tokens_total=drafted, accepted_tokens_total=accepted,
    )  # fmt: skip


def test_a_rarely_accepted_draft_is_switched_off_once_the_engine_is_idle():
    watch = SpecWatch(NGRAM)
    watch, decision = step(watch, _sample(400, 40, busy=1), [], 7, applies=True, spec_type=None)
    assert decision is None and watch.pending is not None  # a request runs: it waits
    watch, decision = step(watch, _sample(400, 40), [], 7, applies=True, spec_type="ngram-mod")
    assert decision is not None and decision.action == "off"
    assert watch.guard is None and watch.pending is None
    assert watch.view(SAMPLED) == SpecStatus("ngram-mod", False, decision.reason, 0.1, None)


def test_a_mode_the_user_chose_is_kept_with_the_guards_warning():
    watch, decision = step(
        SpecWatch(NGRAM, asked=True), _sample(400, 40), [], 7, applies=True, spec_type="ngram-mod"
    )
    assert decision is None and watch.guard is not None
    view = watch.view(SAMPLED)
    assert view is not None and view.active
    assert view.reason.startswith("10% of 400 drafted tokens accepted")
    assert view.reason.endswith("; kept, as --spec asked: it costs speed")


def test_a_new_engine_counts_from_its_own_start_and_serving_forgets_the_decision():
    watch, _ = step(SpecWatch(NGRAM), _sample(300, 290), [], 7, applies=True, spec_type=None)
    assert watch.guard is not None and watch.guard.drafted_at_start == 300
    watch, decision = step(watch, _sample(300, 30), [], 8, applies=True, spec_type=None)
    assert decision is not None  # the new engine's own 300 drafts, not none past the old 300
    watch = SpecWatch(NGRAM, pending=decision, off=SAMPLED).serving(NGRAM)
    assert (watch.pending, watch.off, watch.view(SAMPLED)) == (None, None, SAMPLED)
