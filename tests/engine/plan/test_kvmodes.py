"""A long context's modes on the Lucebox engine: which the planner offers to measure, how one
mode is re-planned for its trial (the one planner), and how `plan` shows what the store holds."""

from __future__ import annotations

import dataclasses

from benchmarks.lucebox_models import TARGET
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.core.units import GIB, MIB
from lucebox.engine.machine.budget import DeviceBudget, GpuBudget, pool_of
from lucebox.engine.machine.config import Settings
from lucebox.engine.pipeline import Prepared
from lucebox.engine.plan.lucebox import kvmodes
from lucebox.engine.plan.lucebox.kvmodes import KvModes, KvTrial, ModeRate
from lucebox.engine.plan.options import ServeOptions
from lucebox.engine.plan.speculation.measurements import STORE_VERSION, ProbeRate, read_section
from lucebox.engine.runstart import Replanner
from support.ggufgen import cached_gguf
from tests.conftest import run_lucebox
from tests.engine.plan.test_kvmode import target
from tests.engine.plan.test_luceboxplan import plan

CTX = 65536
ALL = ("exact q8_0", "exact q4_0", "kvflash q8_0", "kvflash q4_0")


def card(free_mib: int) -> GpuBudget:
    return pool_of(
        (DeviceBudget(0, "NVIDIA GeForce RTX 4090", 24 * GIB, free_mib * MIB),), 64 * GIB
    )


def wide_target() -> str:
    """A target whose KV costs enough that a 64K context needs a real share of a card."""
    return str(cached_gguf(dataclasses.replace(TARGET, n_head_kv=8, header_only=True)))


def q4_only_card() -> GpuBudget:
    """The card on which ``CTX`` fits exactly at q4_0 but not at q8_0 (found by the planner)."""
    options = ServeOptions(model=wide_target(), ctx=CTX, engine="lucebox")

    def least(kv_type: str) -> int:
        low, high = 1024, 24 * 1024
        while high - low > 4:
            middle = (low + high) // 2
            found = plan(options, card(middle)).plan
            exact = found.kvflash_pool_tokens is None and found.fits
            good = exact and found.cache_type_k in (kv_type, "q8_0")
            low, high = (low, middle) if good else (middle, high)
        return high

    return card((least("q4_0") + least("q8_0")) // 2)


def test_a_long_lucebox_launch_offers_every_mode_and_a_short_one_none():
    long = plan(ServeOptions(model=target(), ctx=CTX, engine="lucebox"))
    modes = long.kv_modes
    assert modes is not None and modes.serving == "exact q8_0"
    assert tuple(t.label for t in modes.trials) == ALL
    assert modes.long_tokens == CTX // 2
    short = plan(ServeOptions(model=target(), ctx=16384, engine="lucebox"))
    assert short.kv_modes is None
    # A trial's own launch pins one mode: it measures nothing of its own.
    pinned = plan(ServeOptions(model=target(), ctx=CTX, engine="lucebox", kv_type="q4_0"))
    assert pinned.plan.cache_type_k == "q4_0" and pinned.kv_modes is None


def test_each_trial_is_planned_by_the_one_planner_at_the_served_context():
    budget = q4_only_card()
    served = plan(ServeOptions(model=wide_target(), ctx=CTX, engine="lucebox"), budget)
    assert served.plan.cache_type_k == "q4_0" and served.plan.kvflash_pool_tokens is None
    assert served.kv_modes is not None and served.kv_modes.serving == "exact q4_0"
    replanner = Replanner(resolve_paths(), Prepared(served, Settings(), 0, 60.0))
    exact_q8 = replanner.for_kv_trial(KvTrial("exact", "q8_0"))
    assert isinstance(exact_q8, str) and exact_q8.startswith("the plan does not fit")
    for kv_type in ("q8_0", "q4_0"):
        pooled = replanner.for_kv_trial(KvTrial("kvflash", kv_type))
        assert not isinstance(pooled, str), pooled
        assert pooled.lucebox is not None and pooled.lucebox.kvflash_pool is not None
        assert pooled.lucebox.cache_type == kv_type and pooled.plan.ctx == served.plan.ctx
    exact_q4 = replanner.for_kv_trial(KvTrial("exact", "q4_0"))
    assert not isinstance(exact_q4, str) and exact_q4.lucebox is not None
    assert exact_q4.lucebox.kvflash_pool is None and exact_q4.lucebox.cache_type == "q4_0"


def test_plan_shows_the_measured_modes_and_what_each_gives_up(tmp_path):
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path)})
    options = ServeOptions(model=target(), ctx=CTX, engine="lucebox")
    first = plan(options)
    assert first.kv_modes is not None
    key = first.kv_modes.key

    def rate(label: str, long_tok_s: float, pool: int | None = None) -> ModeRate:
        probes = (
            ProbeRate("chat", 96, 96 / 400.0),
            ProbeRate(
                kvmodes.LONG_PROBE, 128, 128 / long_tok_s, prompt_tokens=32768, prefill_s=4.0
            ),
        )
        return ModeRate(label, pool, probes, 1.0)

    stored = (
        KvModes(key)
        .with_rate(rate("exact q8_0", 300.0))
        .with_rate(rate("kvflash q8_0", 380.0, 16384))
        .with_refused("exact q4_0", "it does not fit")
    )
    kvmodes.write_modes(paths, stored)
    assert (
        read_section(paths, kvmodes.SECTION)[key]["rates"]["kvflash q8_0"]["pool_tokens"] == 16384
    )
    again = kvmodes.plan_modes(paths, key, ("q8_0", "q4_0"), "exact q8_0", CTX)
    assert [v.label for v in again.measured] == ["exact q8_0", "kvflash q8_0"]
    assert again.unmeasured == ("kvflash q4_0",)
    lines = again.lines()
    assert lines[0].startswith("exact q8_0 (serving): 400.0 tok/s, 300.0 tok/s after 32,768")
    assert "gives up almost nothing (8-bit KV)" in lines[0]
    assert "gives up exactness: sparse attention over a 16,384-token pool" in lines[1]
    assert lines[2].startswith("unmeasured: kvflash q4_0")
    document = again.to_json()
    assert document["cannot_serve"] == {"exact q4_0": "it does not fit"}
    assert document["measured"][1]["long_tok_s"] == 380.0
    # Another section beside the others: the store's version did not move.
    assert STORE_VERSION == 2 and read_section(paths, "entries") == {}


def test_the_plan_command_prints_the_modes_of_a_long_context():
    done = run_lucebox("plan", "--model", target(), "--ctx", str(CTX), "--engine", "lucebox",
                       "--vram-mib", "81000")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "  long-context modes, measured on this card:" in done.stdout
    assert f"    unmeasured: {', '.join(ALL)}" in done.stdout
    short = run_lucebox("plan", "--model", target(), "--ctx", "8192", "--engine", "lucebox",
                        "--vram-mib", "81000")  # fmt: skip
    assert short.returncode == 0 and "long-context modes" not in short.stdout


def test_the_key_is_the_context_asked_for_so_free_memory_does_not_move_it():
    """An unasked context follows the card's free memory: keyed by it, every start would
    measure the modes again and `plan` beside a running server would not find them."""
    options = ServeOptions(model=wide_target(), engine="lucebox")
    auto = [plan(options, card(mib)) for mib in (3000, 3400)]
    assert auto[0].plan.ctx != auto[1].plan.ctx
    keys = {launch.kv_modes.key for launch in auto if launch.kv_modes is not None}
    # The sampling the launch's requests get by default comes last (llama.cpp's rule: 0.8).
    assert len(keys) == 1 and next(iter(keys)).endswith(" | 0 | t0.8")
    asked = plan(ServeOptions(model=target(), ctx=CTX, engine="lucebox"))
    assert asked.kv_modes is not None and asked.kv_modes.key.endswith(f" | {CTX} | t0.8")


def test_a_damaged_entry_is_measured_again_not_a_traceback():
    good: dict[str, object] = {"pool_tokens": None, "probes": [], "at": 1.0}
    stored = {"rates": {"exact q8_0": good, "kvflash q8_0": {"probes": [None], "at": 1.0},
                        "exact q4_0": {"probes": [], "at": "soon"}}}  # fmt: skip
    found = KvModes.from_json("k", stored)
    assert found is not None and [r.label for r in found.rates] == ["exact q8_0"]
