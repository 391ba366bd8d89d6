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


def test_the_lucebox_engine_on_two_cards_shows_each_card_planned_used_and_load():
    """Tensor parallel on two cards: a bar per card with its planned bytes, what the engine
    uses there and the card's load, from the sampler's reading of each GPU."""
    import dataclasses

    from benchmarks.lucebox_models import DRAFT, TARGET
    from lucebox.engine.run.sample import Sample
    from support.ggufgen import cached_gguf
    from tests.engine.plan.test_luceboxdevices import HELP_4CF58A04, plan_on, two_cards

    # The deep target: enough layer weights that splitting them pays for tensor parallel.
    deep = dataclasses.replace(TARGET, n_layer=32, n_ff=8192)
    files = tuple(cached_gguf(dataclasses.replace(m, header_only=True)) for m in (deep, DRAFT))
    launch = plan_on(files, two_cards(4600), HELP_4CF58A04, ctx=262144)
    assert launch.to_json()["placement"] == "tensor"
    prepared = Prepared(launch, Settings(), 0, 60.0)
    (_, first), (_, second) = launch.plan.device_bytes
    sample = Sample(0.0, None, None, None, None, None, None, None, None, 0,
                    gpu_loads=((0, first, 41), (1, second + 2**20, 39)))  # fmt: skip
    text = vram_bar(prepared, None, 40, sample).plain
    assert text.count("GPU 0: NVIDIA GeForce RTX 3090\n") == 1
    assert f"plan {first / 2**30:.2f} of 4.5 GiB · uses {first / 2**30:.2f} · GPU 41%" in text
    assert f"· uses {(second + 2**20) / 2**30:.2f} · GPU 39%" in text
    before = device_bars(prepared, 40).plain
    assert "uses" not in before and before.count("plan ") == 2


def test_a_served_set_shows_each_card_planned_used_and_load():
    from lucebox.app.tui.widgets.models import card_lines
    from lucebox.engine.run.sample import GpuStatus
    from lucebox.engine.run.servedsetmodels import ModelStatus

    models = (
        ModelStatus("big", "loaded", "GPU 0: NVIDIA H200", 3 * 2**30, 1.0, 3 * 2**30 + 2**29),
        ModelStatus("small", "unloaded", "GPU 1: NVIDIA H200", 0, None, 2**31),
        ModelStatus("tiny", "unloaded", "GPU 1: NVIDIA H200", 0, None, 2**30),
    )
    gpus = (GpuStatus(0, 140 * 2**30, 141 * 2**30, 40), GpuStatus(1, 2**30, 141 * 2**30, None))
    assert card_lines(models, gpus) == [
        "GPU 0 · plan 3.50 · uses 140.00 of 141.0 GiB · load 40%",
        "GPU 1 · plan 3.00 · uses 1.00 of 141.0 GiB",
    ]
