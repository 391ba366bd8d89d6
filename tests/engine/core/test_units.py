"""Sizes and rates are written one way everywhere."""

from __future__ import annotations

from lucebox.engine.core.units import GIB, MIB, gib_text, mib_text, rate_text, to_gib


def test_sizes_and_rates_carry_their_unit():
    assert gib_text(3 * GIB) == "3.0 GiB"
    assert gib_text(int(1.294 * GIB), 2) == "1.29 GiB"
    assert gib_text(1536 * GIB, 0) == "1,536 GiB"
    assert mib_text(1536 * MIB) == "1,536 MiB"
    assert mib_text(MIB // 2, 1) == "0.5 MiB"
    assert rate_text(48.5 * MIB) == "48.5 MiB/s"
    assert to_gib(GIB // 4) == 0.25
