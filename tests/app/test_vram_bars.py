"""The dashboard's VRAM panel: one bar per device of a split plan."""

from __future__ import annotations

from lucebox.app.tui.widgets.gpu import device_bars, vram_bar
from lucebox.engine.machine.config import Settings
from lucebox.engine.pipeline import Prepared
from tests.engine.machine.test_peers import _budget, _peer
from tests.engine.plan.test_memory_plan import _launch


def test_a_split_plan_shows_a_bar_per_device():
    found = (_peer("10.0.0.2:50052", 12, 0.3),)
    launch = _launch(_budget(((12, 0.3),), found), "qwen3.6-27b")
    prepared = Prepared(launch, Settings(), 0, 60.0)
    text = device_bars(prepared, 40).plain
    assert "peer 10.0.0.2:50052: CUDA0: RTX 3090" in text and "GPU 0: " in text
    assert text.count("█" * 40) == 2  # each bar fills the width: planned + room
    assert text in vram_bar(prepared, None, 40).plain


def test_one_device_shows_no_extra_bars():
    launch = _launch(_budget(((24, 0.3),), ()), "qwen3-14b")
    assert device_bars(Prepared(launch, Settings(), 0, 60.0), 40).plain == ""
