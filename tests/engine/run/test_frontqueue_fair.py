"""Fair order across keys in the front's queue: several people take turns, one person's burst
does not hold another back, and one person's requests keep their order."""

from __future__ import annotations

from lucebox.engine.run.front.frontqueue import FrontQueue, Ticket, fair_order
from lucebox.engine.run.runstate import Status


def _drain(queue: FrontQueue, running: Ticket, waiting: list[Ticket]) -> list[Ticket]:
    """The order the ``waiting`` requests get the engine, each finishing before the next."""
    served: list[Ticket] = []
    while len(served) < len(waiting):
        queue.leave(running)
        admitted = [t for t in waiting if t.admitted.is_set() and t not in served]
        assert len(admitted) == 1  # one slot: one at a time
        running = admitted[0]
        served.append(running)
    return served


def test_a_burst_from_one_key_does_not_starve_another():
    queue = FrontQueue(capacity=1, max_waiting=32)
    first = queue.enter(0.0, "ann")
    burst = [queue.enter(1.0 + i, "ann") for i in range(5)]
    bob = queue.enter(10.0, "bob")
    carol = queue.enter(11.0, "carol")
    # Ann's burst came first, yet Bob and Carol, never served, are next; Ann's keep order.
    assert queue.position(bob) == 1 and queue.position(carol) == 2
    assert queue.position(burst[0]) == 3 and queue.position(burst[1]) == 4
    order = _drain(queue, first, [*burst, bob, carol])
    assert order == [bob, carol, *burst]


def test_keys_take_turns_round_robin():
    queue = FrontQueue(capacity=1, max_waiting=32)
    running = queue.enter(0.0, "ann")
    ann = [queue.enter(1.0 + i, "ann") for i in range(3)]
    bob = [queue.enter(2.5 + i, "bob") for i in range(3)]
    order = _drain(queue, running, ann + bob)
    # Ann was served last: Bob goes first, then they alternate.
    assert order == [bob[0], ann[0], bob[1], ann[1], bob[2], ann[2]]


def test_one_key_alone_is_first_come_first_served():
    queue = FrontQueue(capacity=2, max_waiting=32)
    running = [queue.enter(0.0, None), queue.enter(0.1, None)]
    waiting = [queue.enter(1.0 + i, None) for i in range(4)]
    assert [queue.position(t) for t in waiting] == [1, 2, 3, 4]
    queue.leave(running[0])
    assert waiting[0].admitted.is_set() and not waiting[1].admitted.is_set()
    assert queue.position(waiting[1]) == 1


def test_the_order_is_a_pure_function_of_the_waiting_and_the_last_turns():
    tickets = [Ticket(float(i), key) for i, key in enumerate("aabca")]
    assert [t.key for t in fair_order(tickets, {})] == list("abcaa")
    # "a" was served most recently: the others go first; among never-served keys, arrival.
    assert [t.key for t in fair_order(tickets, {"a": 5, "b": 2})] == list("cbaaa")
    assert fair_order([], {}) == []


def test_status_shows_the_users_planned_and_the_slots_busy():
    queue = FrontQueue(capacity=4, max_waiting=32)
    tickets = [queue.enter(float(i), "ann" if i % 2 else "bob") for i in range(6)]
    for ticket in tickets[:3]:
        queue.serving(ticket)  # the fourth is admitted, not yet sent: it counts as waiting
    users = Status("ready", queue=queue.status()).to_json()["users"]
    assert users == {"planned": 4, "slots_busy": 3, "waiting": 3}
    assert Status("ready").to_json()["users"] is None  # no front: nothing planned here
