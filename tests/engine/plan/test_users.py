"""Several people at once: the slots a plan gives llama-server, each person's share, the agent's
saved slot, fewer users where each would get too little, and the Lucebox engine's queue."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.lucebox_models import TARGET
from lucebox.engine import pipeline
from lucebox.engine.core.errors import ConfigError, UsageError
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.core.units import GIB, MIB
from lucebox.engine.machine.budget import GpuBudget
from lucebox.engine.machine.config import Settings, parse_value
from lucebox.engine.models.headerinfo import inspect_model
from lucebox.engine.models.modelfacts import facts_from_info
from lucebox.engine.plan.memory.memory import make_plan
from lucebox.engine.plan.memory.request import PlanRequest
from lucebox.engine.plan.options import ServeOptions, options_from, resolve
from lucebox.engine.plan.planner import installs_of, plan_launch
from lucebox.engine.plan.users import SHARE_MIN_CTX, fit_users, llama_users, queued_users
from support.ggufgen import ModelSpec, cached_gguf

CARD = GpuBudget("a 24 GiB card", 24 * GIB, 23 * GIB, is_gpu=True, host_total_bytes=64 * GIB)
RAM = GpuBudget("CPU (no NVIDIA GPU): system RAM", 24 * GIB, 22 * GIB, is_gpu=False)


@pytest.fixture(scope="module")
def model():
    return cached_gguf(ModelSpec(n_ctx=32768, basename="tiny-users"))


def _launch(model, budget=CARD, settings: Settings | None = None, **asked):
    options = ServeOptions(model=str(model), **asked)
    resolved = resolve(options, settings or Settings())
    return plan_launch(
        resolve_paths(), options, resolved=resolved, budget=budget, installs=installs_of()
    )


def test_four_users_get_four_slots_sharing_one_unified_pool(model):
    launch = _launch(model, users=4)
    users = launch.users
    assert users is not None and (users.asked, users.slots, users.queued) == (4, 4, 0)
    argv = launch.argv
    assert argv[argv.index("-np") + 1] == "4" and "--kv-unified" in argv
    assert users.ctx == launch.plan.ctx and users.share_ctx == launch.plan.ctx // 4
    # Each person's context and the agent's slot are stated, in the plan document too.
    assert f"up to {launch.plan.ctx} tokens" in users.reason
    assert "agent's saved slot restores into slot 0" in users.reason
    assert "host-RAM prompt cache" in users.reason
    assert launch.to_json()["users"]["slots"] == 4 and users.note == ""


def test_one_user_is_todays_single_slot(model):
    launch = _launch(model)
    argv = launch.argv
    assert argv[argv.index("-np") + 1] == "1" and "--kv-unified" not in argv
    assert launch.users is not None and launch.users.slots == 1
    # server.users in config.toml plans the same as --users.
    from_setting = _launch(model, settings=Settings(users=3))
    assert from_setting.users is not None and from_setting.users.slots == 3
    assert from_setting.plan.ctx == launch.plan.ctx  # the pool is sized from memory as before


def test_too_many_users_for_the_context_are_planned_fewer_and_said(model):
    # 8192 asked: 4 people would have 2048 each, 8 only 1024.
    launch = _launch(model, users=8, ctx=8192)
    users = launch.users
    assert users is not None and users.slots == 4 and users.queued == 4
    assert users.share_ctx >= SHARE_MIN_CTX
    assert users.note.startswith("8 users asked, 4 planned: 8 would share 8192 tokens")
    assert launch.plan.ctx == 8192  # a context the user asked for is not shrunk for them
    alone = _launch(model, users=2, ctx=2048)
    assert alone.users is not None and alone.users.slots == 1
    assert "2 users asked, 1 planned" in alone.users.note


def test_slots_that_each_keep_a_state_are_weighed_in_memory():
    # A hybrid model's recurrent state is per slot: slots that would push weights off the
    # card (or not fit at all) are not planned.
    spec = dataclasses.replace(TARGET, header_only=True)
    facts = facts_from_info(inspect_model(cached_gguf(spec)))
    assert facts.recurrent_state_bytes > 0
    # The smallest card (in 64 MiB steps) where one slot holds the whole model.
    card, one = CARD, make_plan(PlanRequest(facts, CARD, ctx=8192))
    for free_mib in range(1024, 24 * 1024, 64):
        card = GpuBudget("a small card", (free_mib + 512) * MIB, free_mib * MIB, is_gpu=True,
                         host_total_bytes=64 * GIB)  # fmt: skip
        one = make_plan(PlanRequest(facts, card, ctx=8192))
        if one.fits and one.n_gpu_layers < 0:
            break
    assert one.fits and one.n_gpu_layers < 0
    request, why = fit_users(PlanRequest(facts, card, ctx=8192), 4 * 12, make_plan)
    assert 1 < request.parallel < 4 * 12
    assert why.startswith(f"48 users asked, {request.parallel} planned: 48 slots")
    chosen = make_plan(request)
    assert chosen.fits and chosen.n_gpu_layers < 0


def test_no_prompt_cache_says_the_agent_reads_its_prompt_again(model):
    facts = facts_from_info(inspect_model(model))
    plan = make_plan(PlanRequest(facts, CARD, parallel=2, prompt_cache=False))
    users = llama_users(2, plan, "")
    assert "reads it again" in users.reason


def test_the_lucebox_engine_queues_the_users_it_cannot_serve_at_once():
    users = queued_users(4, 65536)
    assert (users.slots, users.queued, users.share_ctx) == (1, 3, 65536)
    assert "one request at a time" in users.note and "queue" in users.note
    assert queued_users(1, 65536).note == ""


def test_users_are_checked_where_they_are_given():
    with pytest.raises(ConfigError, match=r"server\.users"):
        parse_value("server.users", "0")
    assert parse_value("server.users", "4") == 4
    with pytest.raises(UsageError, match=r"server\.users"):
        resolve(ServeOptions(), Settings(users=0))
    with pytest.raises(UsageError, match=r"--users"):
        resolve(ServeOptions(users=65), Settings())
    assert options_from({"users": 4}).users == 4
    assert ServeOptions(users=4).to_args() == ["--users", "4"]


def test_up_says_why_fewer_users_are_planned():
    events: list[pipeline.StepEvent] = []
    options = ServeOptions(preset="qwen3.6-27b", vram_mib=(24576,), engine="llama-server", users=64)
    prepared = pipeline.prepare(resolve_paths(), options, events.append, dry_run=True)
    users = prepared.launch.users
    assert users is not None and 1 < users.slots < 64
    notes = [e.message for e in events if e.state == "note" and e.step == "plan"]
    assert notes == [users.note] and notes[0].startswith(f"64 users asked, {users.slots} planned")
