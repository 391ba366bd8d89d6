"""lucebox's own requests pair once each with the engine's finished lines, whichever of the two
reaches lucebox first; a client's request is never claimed."""

from __future__ import annotations

from lucebox.engine.run.kinds.ownrequests import OwnRequests


def test_a_line_before_its_answer_and_one_after_each_pair_once():
    own = OwnRequests()
    with own.sending() as answered:
        assert own.claims()  # its line came first: claimed while in flight
        answered.append(True)
    assert not own.claims()  # a client's, after the answer paired the line
    with own.sending() as answered:
        answered.append(True)
    assert own.claims() and not own.claims()  # its line came after the answer


def test_a_request_given_up_leaves_no_claim_behind():
    own = OwnRequests()
    with own.sending():
        pass  # cancelled: a client came; the engine may never log it
    assert not own.claims()
    with own.sending():
        assert own.claims()
    assert not own.claims()


def test_a_new_engine_forgets_answers_its_log_never_showed():
    own = OwnRequests()
    with own.sending() as answered:
        answered.append(True)
    own.new_engine()
    assert not own.claims()
