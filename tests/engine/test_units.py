"""Sizes and rates are written one way everywhere."""

from __future__ import annotations

from lucebox.engine.units import GIB, MIB, gib, in_gib, mib, mib_per_s


def test_sizes_and_rates_carry_their_unit():
    assert gib(3 * GIB) == "3.0 GiB"
    assert gib(int(1.294 * GIB), 2) == "1.29 GiB"
    assert mib(1536 * MIB) == "1,536 MiB"
    assert mib_per_s(48.5 * MIB) == "48.5 MiB/s"
    assert in_gib(GIB // 4) == 0.25
