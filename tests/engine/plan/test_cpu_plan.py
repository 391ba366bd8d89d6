"""A CPU plan keeps the PC usable: RAM left to the desktop, a context the CPU reads in time."""

from __future__ import annotations

import dataclasses

from lucebox.engine.core.units import GIB
from lucebox.engine.machine.budget import GpuBudget
from lucebox.engine.models.headerinfo import inspect_model
from lucebox.engine.models.modelfacts import ModelFacts, facts_from_info
from lucebox.engine.plan.launchplan import LaunchPlan
from lucebox.engine.plan.memory import cpuread
from lucebox.engine.plan.memory.hostram import cpu_keep_free_bytes
from lucebox.engine.plan.memory.memory import make_plan
from lucebox.engine.plan.memory.request import PlanRequest
from lucebox.engine.plan.options import ServeOptions, resolve
from lucebox.engine.plan.planner import installs_of
from support.ggufgen import ModelSpec, cached_gguf

RAM = GpuBudget("CPU (no NVIDIA GPU): system RAM", 24 * GIB, 22 * GIB, is_gpu=False)


def _facts(weights_gib: float) -> ModelFacts:
    facts = facts_from_info(inspect_model(cached_gguf(ModelSpec(n_ctx=131072))))
    return dataclasses.replace(facts, weights_bytes=int(weights_gib * GIB))


def test_the_rest_of_the_pc_keeps_its_share_of_ram():
    assert cpu_keep_free_bytes(24 * GIB) == int(24 * GIB * 0.15)
    assert cpu_keep_free_bytes(8 * GIB) == 2 * GIB
    assert cpu_keep_free_bytes(24 * GIB, 6 * GIB) == 6 * GIB
    plan = make_plan(PlanRequest(_facts(12), RAM))
    memory = plan.memory_bytes
    assert memory.reserve == int(24 * GIB * 0.15)
    assert memory.available - memory.total >= memory.reserve >= 2 * GIB
    assert "left to the rest of the PC" in plan.reasons["reserve"]
    # Weights that leave less than the reserve do not fit, in RAM's words.
    too_big = make_plan(PlanRequest(_facts(19.5), RAM))
    assert not too_big.fits
    asked = make_plan(PlanRequest(_facts(18.2), RAM, ctx=131072))
    assert not asked.fits and "free RAM" in asked.reasons["ctx"]


def test_the_context_is_what_the_cpu_reads_in_the_allowed_time():
    facts = _facts(2.0)
    cap = cpuread.read_cap(facts, 300, cores=2)
    assert cap is not None
    assert abs(cap.rate_tok_s - cpuread.BYTE_TOKENS_PER_CORE_S * 2 / (2 * GIB)) < 1e-6
    request = PlanRequest(facts, RAM, read_cap_ctx=cap.ctx, read_cap_reason=cap.reason)
    plan = make_plan(dataclasses.replace(request, read_cap_ctx=5000))
    assert plan.fits and plan.ctx == 4864 and cap.reason in plan.reasons["ctx"]
    capped = make_plan(dataclasses.replace(request, read_cap_ctx=20000))
    assert capped.ctx == 19968 and cap.reason in capped.reasons["ctx"]
    # Not even the smallest context in time: refused as too slow, not shrunk below it.
    slow = make_plan(dataclasses.replace(request, read_cap_ctx=1000))
    assert not slow.fits and "too_slow" in slow.reasons
    # A context the user asks for is theirs.
    asked = make_plan(dataclasses.replace(request, read_cap_ctx=1000, ctx=8192))
    assert asked.fits and asked.ctx == 8192
    assert cpuread.read_cap(facts, 0, cores=2) is None


def test_presets_on_this_cpu_leave_ram_and_read_in_time():
    from lucebox.engine.core.paths import resolve_paths
    from lucebox.engine.machine import config
    from lucebox.engine.plan.sources import presetchoice

    paths = resolve_paths()
    settings = config.load_settings(paths)
    options = ServeOptions()
    resolved = resolve(options, settings)
    table = presetchoice.preset_table(paths, options, resolved, RAM, installs_of())
    fitting = [p for p in table.plans if not p.misfit]
    assert fitting and table.best is not None and table.best.alias == "smollm2"
    for item in table.plans:
        memory = item.plan.memory_bytes
        if item.misfit:
            assert item.misfit in ("ram", "slow")
            continue
        assert memory.available - memory.total >= 2 * GIB
        rate = cpuread.estimated_prefill_tok_s(item.target.facts, cpuread.cpu_cores())
        assert item.plan.ctx / rate <= resolved.cpu_read_s + 1


def test_a_measured_rate_replaces_the_estimate(tmp_path):
    from lucebox.engine.core.paths import resolve_paths
    from lucebox.engine.machine import config
    from lucebox.engine.plan import planner, prefillrates

    paths = resolve_paths()
    model = cached_gguf(ModelSpec(n_ctx=131072, basename="tiny-measured"))
    options = ServeOptions(model=str(model))
    resolved = resolve(options, config.load_settings(paths))
    cores = cpuread.cpu_cores()

    def plan() -> LaunchPlan:
        return planner.plan_launch(
            paths, options, resolved=resolved, budget=RAM, installs=installs_of()
        )

    assert plan().plan.ctx == 131072  # a tiny model: the estimate does not bound it
    recorder = prefillrates.PrefillRecorder(paths, model, cores)
    recorder.observe(1000, 1.0)  # too few tokens to say anything
    assert prefillrates.read_prefill(paths, model, cores) is None
    recorder.observe(3000, 300.0)  # measured 10 tok/s: 3,000 tokens in 5 minutes
    measured = plan().plan
    assert "measured for this model on this PC" in measured.reasons["ctx"]
    assert measured.ctx == 2816
    assert prefillrates.read_prefill(paths, model, cores + 1) is None  # another CPU: estimate


def test_beside_a_gpu_the_ram_keeps_its_share_too():
    from lucebox.engine.plan.memory.hostram import host_ram_bound

    untouched = host_ram_bound(32 * GIB, None, 2 * GIB, 4 * GIB, 0)
    assert untouched == host_ram_bound(32 * GIB, None, 2 * GIB, 4 * GIB, 0)
    assert (untouched.prompt_cache_bytes, untouched.fits, untouched.reason) == (4 * GIB, True, "")
    cut = host_ram_bound(16 * GIB, None, 12 * GIB, 4 * GIB, 0)
    assert (
        cut.fits
        and cut.prompt_cache_bytes == (16 * GIB - 2 * GIB * 1.2 - 12 * GIB) // 2**20 * 2**20
    )
    assert "prompt cache cut" in cut.reason
    refused = host_ram_bound(16 * GIB, None, 15 * GIB, 4 * GIB, 0)
    assert not refused.fits and refused.prompt_cache_bytes == 0

    # A dense model twice the card on a PC with 12 GiB of RAM: the layers left in RAM would
    # leave the rest of the PC less than its 2 GiB.
    facts = dataclasses.replace(
        _facts(18.0), layer_bytes=int(17.5 * GIB), host_bytes=int(0.5 * GIB), n_layer=40
    )
    card = GpuBudget("a 8192 MiB card", 8 * GIB, 8 * GIB, is_gpu=True, host_total_bytes=12 * GIB)
    plan = make_plan(PlanRequest(facts, card))
    assert plan.n_gpu_layers >= 0 and not plan.fits
    assert "leave less than 2.0 GiB of the 12.0 GiB of RAM" in plan.reasons["ram"]
    roomy = dataclasses.replace(card, host_total_bytes=64 * GIB)
    assert make_plan(PlanRequest(facts, roomy)).fits
