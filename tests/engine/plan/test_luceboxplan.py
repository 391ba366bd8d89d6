"""The plan and argv for the Lucebox engine, on the generated qwen35 target measured on the GPU.

The memory figures are checked against what NVML showed for the engine on the H200 after
lucebox's warm-up request and at each request's peak (fixtures/lucebox/serve-memory.jsonl),
planned for the build those runs served from (62880e20): each build has its own fit.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.lucebox_models import DRAFT, TARGET
from lucebox.engine.core.errors import UsageError
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.core.units import GIB, MIB
from lucebox.engine.engines.registry import EngineManifest
from lucebox.engine.machine.budget import DeviceBudget, pool_of
from lucebox.engine.machine.config import Settings
from lucebox.engine.models.gguf import read_header
from lucebox.engine.models.headerinfo import info_from_header
from lucebox.engine.models.modelfacts import facts_from_info
from lucebox.engine.plan.engineview import EngineView, Installs
from lucebox.engine.plan.launch import engine_environ, server_argv
from lucebox.engine.plan.lucebox.luceboxlaunch import disk_cache_argv
from lucebox.engine.plan.lucebox.luceboxplan import (
    DDTREE_MIN_BUDGET,
    PFLASH_SCORING_BYTES,
    LuceboxRequest,
    chunk_logits_bytes,
    ddtree_budget,
    plan_lucebox,
)
from lucebox.engine.plan.options import ServeOptions, resolve
from lucebox.engine.plan.planner import installs_of, plan_launch
from support.ggufgen import cached_gguf, draft_model_for

FIXTURES = Path(__file__).parents[1] / "fixtures" / "lucebox"
H100 = pool_of((DeviceBudget(0, "NVIDIA H100 80GB HBM3", 81079 * MIB, 80_500 * MIB),), 128 * GIB)
H200_FREE_MIB = 139 * 1024
RTX_4090 = pool_of((DeviceBudget(0, "NVIDIA GeForce RTX 4090", 24 * GIB, 23 * GIB),), 64 * GIB)
RECORDED_BUILD = EngineView.of(
    EngineManifest.from_json(json.loads((FIXTURES / "manifest.json").read_text()))
)
"""The 62880e20 build as lucebox installed it on the GPU machine: the build the serve-memory
runs were recorded from, its version picking that build's fit (not the default source's)."""


@pytest.fixture(scope="module")
def files() -> tuple[Path, Path, Path]:
    target = cached_gguf(dataclasses.replace(TARGET, header_only=True))
    draft = cached_gguf(dataclasses.replace(DRAFT, header_only=True))
    mtp = cached_gguf(dataclasses.replace(TARGET, header_only=True, nextn_layers=1))
    return target, draft, mtp


def plan(options: ServeOptions, budget=H100, settings: Settings | None = None, installs=None):
    return plan_launch(
        resolve_paths(), options, resolved=resolve(options, settings or Settings()), budget=budget,
        installs=installs or installs_of(),
    )  # fmt: skip


@pytest.fixture
def recorded_build() -> Installs:
    """The builds to plan with when :data:`RECORDED_BUILD` is the Lucebox build installed."""
    return dataclasses.replace(installs_of(), lucebox=RECORDED_BUILD)


def serve_memory_runs() -> list[dict]:
    """`lucebox serve` on the H200 as `benchmarks/device/drive.sh lucebox_memory_by_stage`
    recorded it: the plan it made and what NVML showed for the engine after the warm-up and at
    its peak per request."""
    lines = (FIXTURES / "serve-memory.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def options_of(argv: list[str], files) -> ServeOptions:
    target, draft, _ = files
    named: dict[str, Any] = dict(zip(argv[::2], argv[1::2], strict=True))
    return ServeOptions(
        model=str(target),
        draft=str(draft) if "--draft" in named else None,
        ctx=int(named["--ctx"]) if "--ctx" in named else None,
        engine=named.get("--engine"),
        prefill=named.get("--prefill"),
    )


@pytest.mark.parametrize("run", serve_memory_runs(), ids=lambda run: run["name"])
def test_plan_within_5_percent_of_the_gpu_after_warm_up_and_covers_the_peak(
    files, run, recorded_build
):
    """Plain at 4096 tokens, DDTree with the Lucebox draft (auto: all 262144 tokens), PFlash,
    and KVFlash on a card another process held all but 2,800 MiB of (a 62K-token prompt over a
    16K-token pool). The other runs had the H200's memory free: only the context the plan
    picks depends on it, and that is checked against the recorded plan."""
    free_bytes = run.get("free_mib", H200_FREE_MIB) * MIB
    budget = pool_of((DeviceBudget(0, "NVIDIA H200", 143771 * MIB, free_bytes),), 128 * GIB)
    launch = plan(options_of(run["argv"], files), budget, installs=recorded_build)
    assert launch.to_json()["engine"]["id"] == RECORDED_BUILD.id
    assert launch.refusal is None or "not on disk" in str(launch.refusal)
    assert [launch.plan.ctx, launch.plan.cache_type_k, launch.plan.kvflash_pool_tokens] == run["kv"]
    memory = launch.plan.memory_bytes
    after_warm_up_mib = run["warm"]["mib"]
    assert abs(memory.total / MIB - after_warm_up_mib) / after_warm_up_mib < 0.05
    stages = ("warm", "full_chunk", "long", "decode")
    assert all(run[stage]["mib"] <= memory.total / MIB * 1.05 for stage in stages)
    measured_peak_mib = max(run[stage]["peak_mib"] for stage in stages)
    assert memory.peak / MIB >= measured_peak_mib
    if run["name"] != "serve-pflash":
        # PFlash's peak counts the 1.2 GB drafter and upstream's scoring reserve: the stand-in
        # drafter loaded less than its file and scored a short prompt, so it stayed below.
        assert (memory.peak / MIB - measured_peak_mib) / measured_peak_mib < 0.05


def test_argv_with_a_lucebox_draft(files):
    target, draft, _ = files
    launch = plan(ServeOptions(model=str(target), draft=str(draft), ctx=32768), RTX_4090)
    assert launch.engine_choice is not None and launch.engine_choice.kind == "lucebox"
    assert launch.to_json()["engine"]["kind"] == "lucebox"
    flags = launch.server.lucebox
    assert flags is not None
    assert launch.argv == [
        "dflash_server", str(target),
        "--host", "127.0.0.1", "--port", "18080", "--model-name", target.stem,
        "--max-ctx", "32768", "--max-tokens", "8192", "--fa-window", "0",
        "--prefix-cache-slots", str(flags.prefix_cache_slots),
        "--cache-type-k", "q8_0", "--cache-type-v", "q8_0",
        "--draft", str(draft), "--ddtree", "--ddtree-budget", "28",
        *disk_cache_argv(flags.disk_cache),
    ]  # fmt: skip
    assert "--spark" not in launch.argv
    assert launch.speculation.spec_type == "ddtree"
    assert launch.to_json()["env"]["DFLASH_SAMPLED_VERIFY"] == "1"
    assert launch.target.path == target and launch.speculation.draft is not None
    assert launch.speculation.draft.check is not None and launch.speculation.draft.check.usable


def test_max_tokens_stays_below_max_ctx_and_the_host_is_loopback(files):
    for ctx in (2048, 4096, 131072):
        launch = plan(ServeOptions(model=str(files[0]), ctx=ctx, engine="lucebox"))
        flags = launch.server.lucebox
        assert flags is not None and flags.max_tokens < flags.max_ctx
        argv = server_argv(launch.server)
        assert argv[argv.index("--host") + 1] == "127.0.0.1"


def test_off_loopback_the_lucebox_engine_serves_behind_the_front_with_a_key(files):
    target, draft, _ = files
    options = ServeOptions(model=str(target), draft=str(draft), ctx=32768, host="0.0.0.0")
    launch = plan(options, RTX_4090)
    assert launch.refusal is None and launch.server.kind == "lucebox"
    server = launch.server
    # The front answers 0.0.0.0:8080 with the user's key; the engine stays on loopback.
    assert (server.host, server.port, server.engine_port) == ("0.0.0.0", 8080, 18080)
    assert server.api_key_file is not None
    argv = server_argv(server)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--port") + 1] == "18080"
    assert "--api-key-file" not in argv  # the engine has no key of its own: the front checks


def test_off_loopback_without_a_key_no_engine_is_started(files):
    launch = plan(ServeOptions(model=str(files[0]), ctx=4096, engine="lucebox", host="0.0.0.0"))
    keyless = dataclasses.replace(launch.server, api_key_file=None)
    with pytest.raises(UsageError, match="without an API key"):
        server_argv(keyless)


def test_a_context_beyond_vram_is_served_with_a_kvflash_pool(files, recorded_build):
    """The recorded KVFlash run's 2,800 MiB free, on the build it ran (62880e20)."""
    small = pool_of((DeviceBudget(0, "NVIDIA GeForce RTX 3060", 12 * GIB, 2800 * MIB),), 64 * GIB)
    launch = plan(
        ServeOptions(model=str(files[0]), ctx=262144, engine="lucebox"),
        small,
        installs=recorded_build,
    )
    assert launch.refusal is None
    pool = launch.plan.kvflash_pool_tokens
    assert pool is not None and 512 <= pool < 262144
    assert launch.argv[launch.argv.index("--kvflash") + 1] == str(pool)
    assert launch.argv[launch.argv.index("--max-ctx") + 1] == "262144"
    assert "not exact" in launch.plan.reasons["ctx"]
    assert launch.plan.memory_bytes.checkpoints > 0  # the paged-out KV, in host RAM
    assert launch.plan.memory_bytes.peak <= 2800 * MIB


def test_the_fit_counts_what_a_prefill_holds_while_it_runs(files, recorded_build):
    """2,600 MiB free on the 62880e20 build's fit: what the engine keeps between requests fits,
    but not with a prefill chunk's logits on top (the engine would die at a long prompt's last
    chunk): refused with the numbers and what to do."""
    card = pool_of((DeviceBudget(0, "NVIDIA GeForce RTX 3060", 12 * GIB, 2600 * MIB),), 64 * GIB)
    launch = plan(
        ServeOptions(model=str(files[0]), ctx=262144, engine="lucebox"),
        card,
        installs=recorded_build,
    )
    memory = launch.plan.memory_bytes
    assert memory.total < 2600 * MIB < memory.peak
    assert memory.prefill_transient == (TARGET.vocab_size or 0) * 4 * 512
    assert launch.refusal is not None
    assert "MiB at its peak" in str(launch.refusal) and "MiB while a prefill runs" in str(
        launch.refusal
    )
    assert "close the other programs that use the GPU" in (launch.refusal.hint or "")
    document = launch.to_json()["memory_bytes"]
    assert document["peak"] == document["total"] + document["prefill_transient"]


@pytest.mark.parametrize(("drafter_mib", "weights_parked"), [(1144, True), (100, False)])
def test_pflash_drafter_counts_in_the_peak_not_as_resident(files, drafter_mib, weights_parked):
    """The drafter loads only while it scores a prompt, the target's weights parked: it adds
    to the peak only what it needs beyond the weights it displaces."""
    target = facts_from_info(info_from_header(read_header(files[0]), str(files[0]), 0))
    card = pool_of((DeviceBudget(0, "NVIDIA GeForce RTX 4090", 24 * GIB, 23 * GIB),), 64 * GIB)
    off = plan_lucebox(LuceboxRequest(target=target, budget=card, ctx=4096))
    on = plan_lucebox(
        LuceboxRequest(
            target=target, budget=card, ctx=4096, prefill="pflash",
            prefill_drafter="Qwen3-0.6B-BF16.gguf", prefill_drafter_bytes=drafter_mib * MIB,
        )
    )  # fmt: skip
    assert on.plan.memory_bytes.total == off.plan.memory_bytes.total
    parked = drafter_mib * MIB + PFLASH_SCORING_BYTES - on.plan.memory_bytes.weights
    expected = parked if weights_parked else chunk_logits_bytes(target)
    assert on.plan.memory_bytes.prefill_transient == expected
    assert "parked off the GPU" in on.reasons["prefill"]
    assert on.flags.prefill == "always" and on.flags.prefill_drafter == "Qwen3-0.6B-BF16.gguf"


def test_auto_chooses_kvflash_when_the_context_does_not_fit_llama_server():
    """A target with four times the KV heads: its whole context does not fit llama-server in
    3,000 MiB, while the Lucebox engine's peak with a KVFlash pool does."""
    wide = cached_gguf(dataclasses.replace(TARGET, n_head_kv=8, header_only=True))
    small = pool_of((DeviceBudget(0, "NVIDIA GeForce RTX 3060", 12 * GIB, 3000 * MIB),), 64 * GIB)
    launch = plan(ServeOptions(model=str(wide), ctx=262144), small)
    assert launch.refusal is None and launch.plan.kvflash_pool_tokens is not None
    assert launch.engine_choice is not None
    assert launch.engine_choice.kind == "lucebox", launch.engine_choice.reason
    assert "KVFlash" in launch.engine_choice.reason


def test_an_mtp_target_with_a_lucebox_draft_stays_on_llama_server_and_says_why(files):
    _, draft, mtp = files
    launch = plan(ServeOptions(model=str(mtp), draft=str(draft)))
    assert launch.engine_choice is not None and launch.engine_choice.kind == "llama-server"
    assert f"{draft.name} cannot be used" in launch.to_json()["engine"]["reason"]
    refused = plan(ServeOptions(model=str(mtp), engine="lucebox"))
    assert refused.refusal is not None and "block count" in str(refused.refusal)


def test_engine_kind_in_config_and_its_reason(files):
    launch = plan(ServeOptions(model=str(files[0])), settings=Settings(engine_kind="lucebox"))
    assert launch.engine_choice is not None and launch.engine_choice.kind == "lucebox"
    assert 'engine.kind = "lucebox" in config.toml' in launch.engine_choice.reason


def test_spec_off_serves_without_the_draft(files):
    target, draft, _ = files
    launch = plan(ServeOptions(model=str(target), draft=str(draft), spec="off"))
    assert "--draft" not in launch.argv
    assert launch.speculation.reason == "off as asked"


@pytest.mark.parametrize(
    ("device", "budget"),
    [("NVIDIA GeForce RTX 3090", 22), ("NVIDIA GeForce RTX 4090", 28),
     ("NVIDIA GeForce RTX 5090", 22), ("NVIDIA H100 80GB HBM3", 22), ("a 24000 MiB card", 22)],
)  # fmt: skip
def test_ddtree_budget_per_card_class_never_under_15(device, budget):
    assert ddtree_budget(device) == budget >= DDTREE_MIN_BUDGET


def test_the_engine_never_reads_dflash_settings_from_lucebox_s_environment(files):
    target, draft, _ = files
    launch = plan(ServeOptions(model=str(target), draft=str(draft)))
    env = engine_environ(launch.server, {"DFLASH_KVFLASH": "auto", "PATH": "/bin"})
    assert "DFLASH_KVFLASH" not in env and env["DFLASH_SAMPLED_VERIFY"] == "1"


def test_a_llama_server_draft_is_not_passed_to_the_lucebox_engine(files):
    """The Lucebox engine loads only DFlash drafts (a qwen3 draft model fails its load): it
    serves without speculation and says why, and the draft stays llama-server's."""
    target = files[0]
    draft = cached_gguf(dataclasses.replace(draft_model_for(TARGET), header_only=True))
    launch = plan(ServeOptions(model=str(target), draft=str(draft), ctx=32768, engine="lucebox"))
    assert launch.server.kind == "lucebox"
    assert "--draft" not in launch.argv and launch.speculation.draft is None
    assert "in llama-server's format" in launch.speculation.reason
    assert draft.name in launch.speculation.reason
    served = plan(ServeOptions(model=str(target), draft=str(draft), ctx=32768))
    assert served.server.kind == "llama-server" and served.speculation.draft is not None


def test_a_lucebox_draft_named_by_a_preset_selects_the_engine_before_any_pull():
    """A preset naming a Lucebox draft (files not on disk: the plan reads the preset's facts)
    is served by the Lucebox engine."""
    from lucebox.engine.models.presets import PresetDraft, PresetFacts, PresetModel, find_preset

    paths = resolve_paths()
    mtp_row = find_preset(paths, "qwen3.6-27b")
    draft = PresetModel(
        "hf:Lucebox/Qwen3.6-27B-DFlash-GGUF/dflash-draft-3.6-q4_k_m.gguf",
        1_000_000_000,
        True,
        PresetFacts("qwen35-dflash-draft", 5, 5120, 248320, 5, 8, 128),
    )
    plain_target = dataclasses.replace(
        mtp_row.target, source="hf:unsloth/Qwen3.6-27B-GGUF/Qwen3.6-27B-Q4_K_M.gguf"
    )
    lucebox_row = dataclasses.replace(
        mtp_row, target=plain_target, draft=PresetDraft(draft, "dflash", None)
    )
    launch = plan_launch(
        paths, ServeOptions(preset=lucebox_row.id),
        resolved=resolve(ServeOptions(preset=lucebox_row.id), Settings()), budget=RTX_4090,
        installs=installs_of(), preset=lucebox_row,
    )  # fmt: skip
    assert launch.engine_choice is not None and launch.engine_choice.kind == "lucebox"
    assert "dflash-draft-3.6-q4_k_m.gguf is a Lucebox DFlash draft" in launch.engine_choice.reason
    assert launch.argv[launch.argv.index("--ddtree-budget") + 1] == "28"


def test_two_gpus_serve_from_the_one_with_the_most_free_memory(files):
    target, draft, _ = files
    two = pool_of(
        (
            DeviceBudget(0, "NVIDIA GeForce RTX 3090", 24 * GIB, 10 * GIB),
            DeviceBudget(1, "NVIDIA GeForce RTX 4090", 24 * GIB, 22 * GIB),
        ),
        64 * GIB,
    )
    launch = plan(ServeOptions(model=str(target), draft=str(draft)), two)
    assert launch.server.gpus == (1,)
    assert launch.plan.memory_bytes.available == 22 * GIB
    assert launch.argv[launch.argv.index("--ddtree-budget") + 1] == "28"
