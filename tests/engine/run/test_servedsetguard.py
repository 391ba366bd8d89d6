"""The speculation guard of a set's models: each fed from its own process's counters, a new
process counted from zero, a decision held until its process is idle."""

from __future__ import annotations

import json

import httpx

from lucebox.engine.run.servedset.servedsetguard import (
    NO_SPEC,
    ChildSpecGuard,
    ModelSpec,
    Watched,
    observe,
    spec_status,
    watched_for,
)
from lucebox.engine.run.servedset.servedsethang import ChildLook, look_at_child

DFLASH = ModelSpec("draft-dflash", 15, "draft x (draft-dflash, 15-token drafts)", guarded=True)


def _watch() -> Watched:
    watched = watched_for(DFLASH, on_gpu=False)
    assert watched is not None
    return watched


def test_a_draft_rarely_accepted_is_shortened_then_switched_off():
    watched, decision = observe(_watch(), 9001, drafted=300, accepted=30)
    assert decision is not None and decision.action == "shorten" and decision.draft_max == 7
    assert "10% of 300 drafted tokens accepted, below the 65% break-even" in decision.reason
    assert watched.acceptance == 0.1
    # The re-planned model has its own guard, counting on from the last look.
    guard = ChildSpecGuard({"q": DFLASH}, {"q": False})
    guard._watched["q"] = watched  # the state after the decision above
    shortened = ModelSpec("draft-dflash", 7, "drafts shortened", guarded=True, shortened=True)
    guard.replanned({"q": shortened})
    after = guard._watched["q"]
    assert after.guard.draft_max == 7 and after.guard.shortened
    assert (after.guard.drafted_at_start, after.port) == (300, 9001)
    _, nothing = observe(after, 9001, drafted=310, accepted=31)
    assert nothing is None  # the old process's last few tokens say nothing yet
    _, off = observe(after, 9002, drafted=300, accepted=3)  # the process with the new flags
    assert off is not None and off.action == "off"
    assert "speculation switched off" in off.reason


def test_a_new_process_counts_from_its_own_start():
    watched, _ = observe(_watch(), 9001, drafted=200, accepted=200)
    watched, decision = observe(watched, 9001, drafted=250, accepted=200)
    assert decision is None  # 250 drafted tokens: fewer than a decision needs
    # The router loaded it again: 100 tokens of the new process, not 100 - 250.
    watched, decision = observe(watched, 9005, drafted=100, accepted=0)
    assert decision is None and watched.guard.drafted_at_start == 0
    _, decision = observe(watched, 9005, drafted=260, accepted=0)
    assert decision is not None and decision.action == "shorten"


def test_only_speculation_lucebox_chose_is_guarded():
    assert watched_for(NO_SPEC, on_gpu=True) is None
    asked = ModelSpec("draft-dflash", 15, "--spec draft as asked", guarded=False)
    assert watched_for(asked, on_gpu=True) is None
    on_gpu = watched_for(DFLASH, on_gpu=True)
    assert on_gpu is not None and on_gpu.guard.floor == 0.16


def _child(drafted: int, accepted: int, busy: bool) -> httpx.MockTransport:
    """A model process's /metrics and /slots as the pinned llama-server writes them."""

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            page = (
                "# TYPE llamacpp:spec_decode_num_draft_tokens_total counter\n"
                f"llamacpp:spec_decode_num_draft_tokens_total {drafted}\n"
                f"llamacpp:spec_decode_num_accepted_tokens_total {accepted}\n"
            )
            return httpx.Response(200, text=page)
        return httpx.Response(200, text=json.dumps([{"id": 0, "is_processing": busy}]))

    return httpx.MockTransport(answer)


async def test_a_decision_waits_until_its_process_runs_no_request():
    guard = ChildSpecGuard({"q": DFLASH, "smol": NO_SPEC}, {"q": False, "smol": False})

    async def looks(child: httpx.MockTransport) -> dict[str, ChildLook]:
        async with httpx.AsyncClient(transport=child) as client:
            return {
                "q": await look_at_child(client, 9001),
                "smol": await look_at_child(client, 9002),
            }

    assert guard.check(await looks(_child(300, 30, busy=True))) == []
    status = guard.status("q")
    assert status is not None and status.active and status.acceptance == 0.1
    assert guard.status("smol") is None
    idle = await looks(_child(320, 31, busy=False))
    due = guard.check(idle)
    assert [(alias, d.action) for alias, d in due] == [("q", "shorten")]
    assert guard.check(idle) == []  # said once


def test_a_switch_off_shows_in_status_after_the_re_plan():
    guard = ChildSpecGuard({"q": DFLASH}, {"q": False})
    _, decision = observe(_watch(), 1, drafted=300, accepted=0)
    assert decision is not None
    guard.switched_off("q", decision)
    guard.replanned({"q": ModelSpec(None, None, "off", guarded=True)})
    status = guard.status("q")
    assert status is not None and status.type == "draft-dflash" and status.active is False
    assert status.reason == decision.reason
    plain = ModelSpec("ngram-mod", None, "n-gram", guarded=True)
    assert spec_status(plain, None, None) == spec_status(plain, Watched(_watch().guard), None)
