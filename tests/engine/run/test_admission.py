"""Eviction by memory: which loaded models go before another loads (tables)."""

from __future__ import annotations

import pytest

from lucebox.engine.run.servedset.admission import Placement, evictions

MIB = 2**20
# The CPU set under a 1000 MiB budget (plans + 40 MiB per process): 960 MiB after the router.
CPU = {
    "smollm2": Placement("ram", 563 * MIB),
    "smoke": Placement("ram", 891 * MIB),
    "tiny": Placement("ram", 47 * MIB),
}
ROOM = {"ram": 960 * MIB, "0": 24 * 1024 * MIB, "1": 24 * 1024 * MIB}
CARDS = {
    "q6": Placement("0", 23 * 1024 * MIB),
    "q4": Placement("1", 23 * 1024 * MIB),
    "gemma": Placement("1", 23 * 1024 * MIB),
}


@pytest.mark.parametrize(
    ("wanted", "loaded", "last_used", "busy", "expected"),
    [
        ("tiny", {"smollm2"}, {}, set(), ()),  # a count of 1 would have evicted smollm2
        ("smoke", {"smollm2", "tiny"}, {"tiny": 1, "smollm2": 2}, set(), ("smollm2",)),
        ("smollm2", {"smoke", "tiny"}, {"tiny": 1, "smoke": 2}, set(), ("smoke",)),
        ("smoke", {"smollm2"}, {}, {"smollm2"}, None),  # busy: it cannot go now
        ("smoke", {"smoke"}, {}, set(), ()),
        ("q4", {"q6", "gemma"}, {"q6": 1, "gemma": 2}, set(), ("gemma",)),  # its own card only
        ("q6", {"q4"}, {}, set(), ()),  # the other card is free: both load
    ],
)
def test_evictions(wanted, loaded, last_used, busy, expected):
    placements = {**CPU, **CARDS}
    found = evictions(wanted, frozenset(loaded), placements, ROOM, last_used, frozenset(busy))
    assert found == expected


def test_the_model_a_request_names():
    from lucebox.engine.run.servedset.servedsetproxy import model_of

    assert model_of(b"/v1/chat/completions", b'{"model": "smoke", "messages": []}') == "smoke"
    assert model_of(b"/metrics?model=smollm2", b"") == "smollm2"
    assert model_of(b"/v1/messages", b"not json") is None
    assert model_of(b"/health", b"") is None
