"""The front's queue: generation requests reach the engine as many at once as it serves (one
for the Lucebox engine, its parallel slots for llama-server); a bounded number wait, and past
that bound a request is told when to try again from the measured rate.

Waiting requests take turns by key (each person's, :func:`fair_order`): one person's burst
does not hold everyone else back; requests of one key keep their arrival order.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Sequence

from lucebox.engine.run.hang import Look
from lucebox.engine.run.sample import QueueStatus

DEFAULT_MAX_WAITING = 32
DEFAULT_SERVICE_S = 10.0
"""A request's assumed time in the engine until one has been measured."""
SERVICE_WEIGHT = 0.3
"""Weight of the latest measured request in the running mean of service times."""
FIRST_TOKENS_KEPT = 64


class QueueFullError(Exception):
    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"the queue is full; retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


class Ticket:
    """One request's place: waiting, admitted (held while the engine is not ready), then in
    the engine, then done."""

    def __init__(self, arrived_s: float, key: str | None = None) -> None:
        self.arrived_s = arrived_s
        self.key = key
        """The name of the key the request carried (None: one that needed none)."""
        self.started_s: float | None = None
        """When the engine got it; None while it waits or is held."""
        self.engine_chunks = 0
        """Chunks of a streamed answer the engine has sent: tokens flowing."""
        self.first_token_s: float | None = None
        """What the client waited for its first token (arrival to the first event that
        carries one, queueing included); None until a streamed answer relays one."""
        self.admitted = asyncio.Event()


def fair_order(waiting: Sequence[Ticket], last_turn: dict[str | None, int]) -> list[Ticket]:
    """``waiting`` in the order they get the engine: round-robin over their keys, each key's in
    arrival order. The keys take turns from the one whose last turn is oldest (never: first,
    then by the arrival of its first waiting request); ``last_turn`` holds each key's last."""
    by_key: dict[str | None, list[Ticket]] = {}
    for ticket in waiting:
        by_key.setdefault(ticket.key, []).append(ticket)
    keys = sorted(by_key, key=lambda k: (last_turn.get(k, -1), by_key[k][0].arrived_s))
    rounds = max((len(tickets) for tickets in by_key.values()), default=0)
    return [by_key[k][i] for i in range(rounds) for k in keys if i < len(by_key[k])]


class FrontQueue:
    """Admission for ``capacity`` requests at once, ``max_waiting`` more waiting, in turns by
    key (:func:`fair_order`)."""

    def __init__(self, capacity: int, max_waiting: int = DEFAULT_MAX_WAITING) -> None:
        self.capacity = max(1, capacity)
        self.max_waiting = max_waiting
        self._waiting: deque[Ticket] = deque()
        self._running: set[Ticket] = set()
        self._mean_service_s: float | None = None
        self._served = 0
        self._rejected = 0
        self._entered = 0
        self._last_turn: dict[str | None, int] = {}
        """Each key's last turn in the engine (the count of turns before it)."""
        self._turns = 0
        self._first_tokens: deque[tuple[float, float]] = deque(maxlen=FIRST_TOKENS_KEPT)
        """(when the request ended, its client's wait for the first token) of streamed
        answers, newest last."""

    def enter(self, arrived_s: float | None = None, key: str | None = None) -> Ticket:
        """A ticket for a request with the key named ``key`` that arrived at ``arrived_s``
        (monotonic; None: now), admitted at once when the engine has room and nobody waits.

        Raises:
            QueueFullError: ``max_waiting`` requests wait already.
        """
        ticket = Ticket(time.monotonic() if arrived_s is None else arrived_s, key)
        self._entered += 1
        if len(self._running) < self.capacity and not self._waiting:
            self._start(ticket)
            return ticket
        if len(self._waiting) >= self.max_waiting:
            self._rejected += 1
            raise QueueFullError(self.retry_after_s())
        self._waiting.append(ticket)
        return ticket

    def position(self, ticket: Ticket) -> int:
        """1 for the next request to run; 0 once it runs."""
        if ticket.admitted.is_set():
            return 0
        if ticket not in self._waiting:
            return 0
        return fair_order(self._waiting, self._last_turn).index(ticket) + 1

    def leave(self, ticket: Ticket) -> None:
        """The request is done, or its client left (waiting or running)."""
        if ticket in self._waiting:
            self._waiting.remove(ticket)
            return
        if ticket not in self._running:
            return
        self._running.discard(ticket)
        if ticket.started_s is not None:
            took_s = time.monotonic() - ticket.started_s
            mean = self._mean_service_s
            self._mean_service_s = (
                took_s if mean is None else mean + SERVICE_WEIGHT * (took_s - mean)
            )
            self._served += 1
        if ticket.first_token_s is not None:
            self._first_tokens.append((time.monotonic(), ticket.first_token_s))
        while self._waiting and len(self._running) < self.capacity:
            ticket = fair_order(self._waiting, self._last_turn)[0]
            self._waiting.remove(ticket)
            self._start(ticket)

    def _start(self, ticket: Ticket) -> None:
        self._last_turn[ticket.key] = self._turns
        self._turns += 1
        self._running.add(ticket)
        ticket.admitted.set()

    def serving(self, ticket: Ticket) -> None:
        """The admitted request goes to the engine now: its service time starts (a hold for
        an engine that was not ready counts as waiting)."""
        ticket.started_s = time.monotonic()

    def held(self, ticket: Ticket) -> None:
        """The request's engine died before answering: it waits for the next one."""
        ticket.started_s = None
        ticket.engine_chunks = 0

    def engine_look(self, now_s: float) -> Look | None:
        """What the front sees of the engine's work, for the hang watch when the engine
        answers no look itself: nothing sent to it (None); a streamed answer flowing
        (decoding, its chunks the progress); else requests sent and silent."""
        sent = [t for t in self._running if t.started_s is not None]
        if not sent:
            return None
        chunks = sum(t.engine_chunks for t in sent)
        return Look(now_s, True, "decode" if chunks else "silent", 0, (chunks,))

    def first_token_s(self, now_s: float, window_s: float) -> tuple[float | None, float | None]:
        """(the mean wait for the first token of the streamed answers that ended in the last
        ``window_s``, the last one's): what clients waited, measured where they wait."""
        recent = [wait for at_s, wait in self._first_tokens if at_s >= now_s - window_s]
        last = self._first_tokens[-1][1] if self._first_tokens else None
        return (sum(recent) / len(recent) if recent else None), last

    def activity(self) -> tuple[int, int]:
        """(requests running or waiting now, requests that ever entered): a measurement that
        must give way to clients compares the second between two looks."""
        return len(self._running) + len(self._waiting), self._entered

    def retry_after_s(self) -> int:
        """Seconds until a request arriving now would likely get a place: the waiting ones
        and the running ones served at the measured rate."""
        service_s = self._mean_service_s or DEFAULT_SERVICE_S
        ahead = len(self._waiting) + 1
        return max(1, math.ceil(service_s * ahead / self.capacity))

    def status(self) -> QueueStatus:
        now_s = time.monotonic()
        held = [t for t in self._running if t.started_s is None]
        arrivals = [t.arrived_s for t in (*held, *self._waiting)]
        oldest = round(now_s - min(arrivals), 1) if arrivals else None
        mean = self._mean_service_s
        return QueueStatus(
            depth=len(self._waiting) + len(held),
            running=len(self._running) - len(held),
            oldest_wait_s=oldest,
            max_waiting=self.max_waiting,
            capacity=self.capacity,
            served=self._served,
            rejected=self._rejected,
            mean_service_s=round(mean, 2) if mean is not None else None,
        )
