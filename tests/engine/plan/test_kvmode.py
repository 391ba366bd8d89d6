"""``--kv-mode``: exactness is the user's call. KVFlash (sparse attention over a resident pool)
serves only when no exact cache gives the context asked for, or when pinned; ``exact`` never
lets a context move to it."""

from __future__ import annotations

import dataclasses

from benchmarks.lucebox_models import TARGET
from lucebox.engine.core.units import GIB, MIB
from lucebox.engine.machine.budget import DeviceBudget, pool_of
from lucebox.engine.plan.options import ServeOptions
from support.ggufgen import cached_gguf
from tests.conftest import run_lucebox
from tests.engine.plan.test_luceboxplan import plan

SMALL = pool_of((DeviceBudget(0, "NVIDIA GeForce RTX 3060", 12 * GIB, 3000 * MIB),), 64 * GIB)


def target() -> str:
    return str(cached_gguf(dataclasses.replace(TARGET, header_only=True)))


def test_a_pinned_kvflash_pool_serves_where_the_exact_cache_fits_and_says_it_is_not_exact():
    auto = plan(ServeOptions(model=target(), ctx=65536, engine="lucebox"))
    assert auto.plan.kvflash_pool_tokens is None and auto.plan.cache_type_k == "q8_0"
    pinned = plan(ServeOptions(model=target(), ctx=65536, kv_mode="kvflash"))
    assert pinned.refusal is None and pinned.engine_kind == "lucebox"
    assert pinned.engine_choice is not None and "--kv-mode kvflash" in pinned.engine_choice.reason
    pool = pinned.plan.kvflash_pool_tokens
    assert pool is not None and pool < 65536
    assert pinned.plan.cache_type_k == "q8_0"  # the pool keeps the best KV type
    assert "with KVFlash as asked" in pinned.plan.reasons["ctx"]
    assert "not exact" in pinned.plan.reasons["ctx"]


def test_exact_never_moves_a_context_to_kvflash_it_refuses_with_the_numbers():
    wide = str(cached_gguf(dataclasses.replace(TARGET, n_head_kv=8, header_only=True)))
    auto = plan(ServeOptions(model=wide, ctx=262144), SMALL)
    assert auto.engine_kind == "lucebox" and auto.plan.kvflash_pool_tokens is not None
    exact = plan(ServeOptions(model=wide, ctx=262144, kv_mode="exact"), SMALL)
    assert exact.engine_kind == "llama-server" and exact.refusal is not None
    assert exact.engine_choice is not None
    assert "not allowed by --kv-mode exact" in exact.engine_choice.reason
    on_lucebox = plan(
        ServeOptions(model=wide, ctx=262144, engine="lucebox", kv_mode="exact"), SMALL
    )
    assert on_lucebox.plan.kvflash_pool_tokens is None and on_lucebox.refusal is not None
    assert "KVFlash (not exact) was not allowed" in on_lucebox.plan.reasons["ctx"]


def test_the_flag_reaches_the_plan_through_the_cli():
    done = run_lucebox("plan", "--model", target(), "--ctx", "65536", "--kv-mode", "kvflash",
                       "--vram-mib", "81000", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert '"kvflash_pool_tokens": null' not in done.stdout
    bad = run_lucebox("plan", "--model", target(), "--kv-mode", "sparse")
    assert bad.returncode == 2


def test_plan_says_which_engine_and_what_is_unmeasured_where_both_engines_serve():
    from benchmarks.lucebox_models import DRAFT

    draft = str(cached_gguf(dataclasses.replace(DRAFT, header_only=True)))
    done = run_lucebox("plan", "--model", target(), "--draft", draft, "--vram-mib", "81000")
    assert done.returncode == 0, done.stderr
    assert "  engine: the Lucebox engine: the draft" in done.stdout
    assert "(the rule, before a measurement on this card)" in done.stdout
    # Neither engine is built in a test home: building the missing one is offered, not done.
    assert "  unmeasured: llama-server is not built" in done.stdout


def test_a_kvflash_launch_is_a_candidate_only_when_the_user_chose_it():
    from lucebox.engine.core.paths import resolve_paths
    from lucebox.engine.machine.config import Settings
    from lucebox.engine.pipeline import Prepared
    from lucebox.engine.runstart import Replanner

    wide = str(cached_gguf(dataclasses.replace(TARGET, n_head_kv=8, header_only=True)))
    pooled = plan(ServeOptions(model=wide, ctx=262144, engine="lucebox"), SMALL)
    assert pooled.plan.kvflash_pool_tokens is not None
    for options, lossy in (
        (ServeOptions(model=wide, ctx=262144), True),
        (ServeOptions(model=wide, ctx=262144, engine="lucebox"), False),
        (ServeOptions(model=wide, ctx=262144, kv_mode="kvflash"), False),
    ):
        prepared = Prepared(plan(options, SMALL), Settings(), 0, 60.0)
        assert Replanner(resolve_paths(), prepared)._lossy(pooled) is lossy
