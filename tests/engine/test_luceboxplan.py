"""The plan and argv for the Lucebox engine, on the generated qwen35 target measured on the H100.

The memory figures are checked against nvidia-smi as recorded on the H100 after lucebox's
warm-up request (tests/engine/fixtures/lucebox/serve-*.smi.txt).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench.lucebox_models import DRAFT, TARGET
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.core.units import GIB, MIB
from lucebox.engine.machine.budget import DeviceBudget, pool_of
from lucebox.engine.machine.config import Settings
from lucebox.engine.plan.engineview import EngineView
from lucebox.engine.plan.launch import engine_environ, server_argv
from lucebox.engine.plan.luceboxplan import DDTREE_MIN_BUDGET, ddtree_budget
from lucebox.engine.plan.options import ServeOptions, resolve
from lucebox.engine.plan.planner import plan_launch
from tests.ggufgen import cached_gguf

FIXTURES = Path(__file__).parent / "fixtures" / "lucebox"
H100 = pool_of((DeviceBudget(0, "NVIDIA H100 80GB HBM3", 81079 * MIB, 80_500 * MIB),), 128 * GIB)
RTX_4090 = pool_of((DeviceBudget(0, "NVIDIA GeForce RTX 4090", 24 * GIB, 23 * GIB),), 64 * GIB)


@pytest.fixture(scope="module")
def files() -> tuple[Path, Path, Path]:
    target = cached_gguf(dataclasses.replace(TARGET, header_only=True))
    draft = cached_gguf(dataclasses.replace(DRAFT, header_only=True))
    mtp = cached_gguf(dataclasses.replace(TARGET, header_only=True, nextn_layers=1))
    return target, draft, mtp


def plan(options: ServeOptions, budget=H100, settings: Settings | None = None):
    return plan_launch(
        resolve_paths(), options, resolved=resolve(options, settings or Settings()), budget=budget,
        engine=EngineView.of(None),
    )  # fmt: skip


def smi_mib(name: str) -> int:
    """The engine process's memory in an nvidia-smi capture (a "PID, N MiB" line)."""
    line = next(x for x in (FIXTURES / name).read_text().splitlines() if "," in x)
    return int(line.split(",")[1].split()[0])


@pytest.mark.parametrize(
    ("with_draft", "ctx", "fixture"),
    [(False, 4096, "serve-plain.smi.txt"), (True, None, "serve-ddtree.smi.txt")],
)
def test_memory_within_5_percent_of_nvidia_smi_after_warm_up(files, with_draft, ctx, fixture):
    """As `lucebox serve` ran on the H100 (79.2 GiB free): --engine lucebox --ctx 4096, and
    with the Lucebox draft (auto: all 262144 tokens at q8_0); measured after the warm-up."""
    target, draft, _ = files
    options = ServeOptions(
        model=str(target), draft=str(draft) if with_draft else None, ctx=ctx, engine="lucebox"
    )
    free = pool_of((DeviceBudget(0, H100.device, 81079 * MIB, int(79.2 * GIB)),), 128 * GIB)
    launch = plan(options, free)
    assert launch.refusal is None and launch.plan.ctx == (ctx or 262144)
    planned_mib = launch.plan.memory_bytes.total / MIB
    measured_mib = smi_mib(fixture)
    assert abs(planned_mib - measured_mib) / measured_mib < 0.05, (planned_mib, measured_mib)


def test_argv_with_a_lucebox_draft(files):
    target, draft, _ = files
    launch = plan(ServeOptions(model=str(target), draft=str(draft), ctx=32768), RTX_4090)
    assert launch.engine_choice is not None and launch.engine_choice.kind == "lucebox"
    assert launch.to_json()["engine"]["kind"] == "lucebox"
    flags = launch.spec.lucebox
    assert flags is not None
    assert launch.argv == [
        "dflash_server", str(target),
        "--host", "127.0.0.1", "--port", "8080", "--model-name", target.stem,
        "--max-ctx", "32768", "--max-tokens", "8192", "--fa-window", "0",
        "--prefix-cache-slots", str(flags.prefix_cache_slots),
        "--cache-type-k", "q8_0", "--cache-type-v", "q8_0",
        "--draft", str(draft), "--ddtree", "--ddtree-budget", "28",
    ]  # fmt: skip
    assert "--spark" not in launch.argv
    assert launch.speculation.spec_type == "ddtree"
    assert launch.to_json()["env"]["DFLASH_SAMPLED_VERIFY"] == "1"
    assert launch.target.path == target and launch.speculation.draft is not None
    assert launch.speculation.draft.check is not None and launch.speculation.draft.check.usable


def test_max_tokens_stays_below_max_ctx_and_the_host_is_loopback(files):
    for ctx in (2048, 4096, 131072):
        launch = plan(ServeOptions(model=str(files[0]), ctx=ctx, engine="lucebox"))
        flags = launch.spec.lucebox
        assert flags is not None and flags.max_tokens < flags.max_ctx
        argv = server_argv(launch.spec)
        assert argv[argv.index("--host") + 1] == "127.0.0.1"


def test_a_context_beyond_vram_is_served_with_a_kvflash_pool(files):
    small = pool_of((DeviceBudget(0, "NVIDIA GeForce RTX 3060", 12 * GIB, 2400 * MIB),), 64 * GIB)
    launch = plan(ServeOptions(model=str(files[0]), ctx=262144, engine="lucebox"), small)
    assert launch.refusal is None
    pool = launch.plan.kvflash_pool_tokens
    assert pool is not None and 512 <= pool < 262144
    assert launch.argv[launch.argv.index("--kvflash") + 1] == str(pool)
    assert launch.argv[launch.argv.index("--max-ctx") + 1] == "262144"
    assert "not exact" in launch.plan.reasons["ctx"]
    assert launch.plan.memory_bytes.checkpoints > 0  # the paged-out KV, in host RAM
    assert launch.plan.memory_bytes.total <= 2400 * MIB


def test_auto_chooses_kvflash_when_the_context_does_not_fit_llama_server(files):
    small = pool_of((DeviceBudget(0, "NVIDIA GeForce RTX 3060", 12 * GIB, 2400 * MIB),), 64 * GIB)
    launch = plan(ServeOptions(model=str(files[0]), ctx=262144), small)
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
    env = engine_environ(launch.spec, {"DFLASH_KVFLASH": "auto", "PATH": "/bin"})
    assert "DFLASH_KVFLASH" not in env and env["DFLASH_SAMPLED_VERIFY"] == "1"


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
        engine=EngineView.of(None), preset=lucebox_row,
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
    assert launch.spec.gpus == (1,)
    assert launch.plan.memory_bytes.available == 22 * GIB
    assert launch.argv[launch.argv.index("--ddtree-budget") + 1] == "28"
