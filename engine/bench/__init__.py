"""Bench: what `lucebox bench` measures against a running server.

``quick`` (a fixed prompt set), ``replay`` and ``transcript`` (an agent's recorded session),
``between`` (a replay with a restart before each call, against the call warm and cold),
``recalibration`` (the bench's server calibrating its speculation between those calls),
``compare`` (configurations started one after another), ``measure`` (one timed streamed call),
``selftest`` (a new engine build tested here before it serves).
"""
