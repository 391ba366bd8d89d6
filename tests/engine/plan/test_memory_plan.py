"""Planner tables over real GGUF headers and scripted GPUs."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.core.units import GIB, MIB
from lucebox.engine.machine.budget import GpuBudget, budget_for
from lucebox.engine.machine.config import Settings
from lucebox.engine.machine.gpu import probe_gpus
from lucebox.engine.models.headerinfo import inspect_model
from lucebox.engine.models.modelfacts import facts_from_info, read_swa_patterns
from lucebox.engine.models.presets import PresetError, facts_from_preset, load_presets, parse_preset
from lucebox.engine.plan.memory.ctxchoice import ENOUGH_CTX
from lucebox.engine.plan.memory.memory import make_plan
from lucebox.engine.plan.memory.request import PlanRequest
from lucebox.engine.plan.memory.sizes import compute_bytes, kv_bytes, kvflash_pool
from lucebox.engine.plan.options import ServeOptions, resolve
from lucebox.engine.plan.planner import installs_of
from lucebox.engine.plan.sources.presetchoice import choose_preset, preset_table
from support.ggufgen import SHAPES, ModelSpec, write_llama
from tests.engine.fake_nvml import FakeGpu, FakeNvml

GEMMA_270M = dataclasses.replace(SHAPES["gemma3-270m"], header_only=True)
LLAMA_8B_HEADER = dataclasses.replace(SHAPES["llama8b"], header_only=True)


@pytest.fixture(scope="module")
def gemma_facts(tmp_path_factory):
    path = write_llama(tmp_path_factory.mktemp("g") / "gemma.gguf", GEMMA_270M)
    return facts_from_info(inspect_model(path), (6, False))


def table_for(budget: GpuBudget, paths=None):
    """Every shipped preset planned for ``budget`` with default flags and no engine built."""
    options = ServeOptions()
    return preset_table(
        paths or resolve_paths(), options, resolve(options, Settings()), budget, installs_of()
    )


def card(gib: float, free_gib: float | None = None) -> GpuBudget:
    total = int(gib * GIB)
    return GpuBudget(f"{gib} GiB card", total, int((free_gib or gib) * GIB), is_gpu=True)


@pytest.mark.parametrize(
    ("ctx", "f16_mib", "q8_mib"),
    [(4096, 27.0, 14.34375), (8192, 39.0, 20.71875), (32768, 111.0, 58.96875)],
)
def test_gemma_kv_matches_the_engine(gemma_facts, ctx, f16_mib, q8_mib):
    # The engine's load log for the real Gemma 3 270M: f16 27/39/111 MiB, q8_0 20.7/59 MiB.
    assert kv_bytes(gemma_facts, ctx, "f16") / MIB == f16_mib
    assert kv_bytes(gemma_facts, ctx, "q8_0") / MIB == q8_mib


@pytest.mark.slow
def test_sliding_window_pattern_comes_from_the_engine_source(built_engine_home):
    source = Path(__file__).resolve().parents[3] / "deps" / "llama.cpp"
    patterns = read_swa_patterns(source)
    assert patterns["gemma3"] == (6, False)
    assert patterns["gemma2"] == (2, False)


def test_hybrid_model_keeps_kv_only_in_attention_layers():
    facts = parse_preset(Path("presets/qwen36-27b-24gb.toml").read_text(), "p").target.facts
    assert facts.full_kv_layers == 16 and facts.recurrent_layers == 48
    from lucebox.engine.models.presets import facts_from_preset

    preset = parse_preset(Path("presets/qwen36-27b-24gb.toml").read_text(), "p")
    model = facts_from_preset(preset.target, preset.native_ctx, "q")
    # 16 layers x 4 KV heads x (256 + 256) x 2 bytes = 64 KiB per token at f16.
    per_token = (kv_bytes(model, 65536, "f16") - kv_bytes(model, 32768, "f16")) / 32768
    assert per_token == 64 * 1024
    assert kv_bytes(model, 256, "f16") > 48 * 3_000_000  # plus the recurrent state


def test_sliding_window_layers_use_their_own_head_size(tmp_path):
    # Gemma 4 shape: five sliding-window layers with 256-wide heads, one global with 512.
    spec = ModelSpec(
        arch="gemma4",
        n_layer=6,
        n_embd=256,
        n_head=4,
        n_head_kv=2,
        head_dim=512,
        sliding_window=512,
        header_only=True,
        extra_kv={
            "gemma4.attention.key_length_swa": 256,
            "gemma4.attention.value_length_swa": 256,
            "gemma4.attention.sliding_window_pattern": [True] * 5 + [False],
        },
    )
    facts = facts_from_info(inspect_model(write_llama(tmp_path / "g.gguf", spec)))
    assert facts.full_kv_elems_per_token == 1 * 2 * (512 + 512)
    assert facts.swa_kv_elems_per_token == 5 * 2 * (256 + 256)
    assert facts.max_layer_kv_elems == 2 * (512 + 512)
    assert facts.max_swa_layer_kv_elems == 2 * (256 + 256)
    shared = dataclasses.replace(
        spec, extra_kv={**spec.extra_kv, "gemma4.attention.shared_kv_layers": 2}
    )
    # The last two layers (one sliding-window, the global one) read earlier layers' cache.
    facts = facts_from_info(inspect_model(write_llama(tmp_path / "s.gguf", shared)))
    assert facts.full_kv_elems_per_token == 0
    assert facts.swa_kv_elems_per_token == 4 * 2 * (256 + 256)


@pytest.mark.parametrize("gib", [8, 12, 16, 24, 32, 80])
def test_llama_8b_on_scripted_cards(tmp_path, gib):
    facts = facts_from_info(inspect_model(write_llama(tmp_path / "l.gguf", LLAMA_8B_HEADER)))
    plan = make_plan(PlanRequest(target=facts, budget=card(gib)))
    memory = plan.memory_bytes
    assert plan.fits
    assert plan.ctx % 256 == 0 and plan.ctx <= 131072
    assert memory.total + memory.reserve <= card(gib).vram_free_bytes
    assert set(plan.reasons) >= {"ctx", "cache_type", "n_gpu_layers", "reserve"}


def test_bigger_cards_never_get_less_context(gemma_facts):
    contexts = [
        make_plan(PlanRequest(target=gemma_facts, budget=card(g, g * 0.01))).ctx
        for g in (8, 12, 16, 24)
    ]
    assert contexts == sorted(contexts)


def test_another_app_holding_6_gib_leaves_less():
    probe = probe_gpus(FakeNvml(gpus=[FakeGpu(processes=[(4242, 6 * GIB)])]))
    budget = budget_for(probe)
    assert budget.vram_free_bytes < 18.5 * GIB

    def contexts(budget: GpuBudget) -> dict[str, int]:
        table = table_for(budget)
        return {p.alias: p.plan.ctx for p in table.plans}

    busy, idle = contexts(budget), contexts(card(24))
    assert busy["qwen3.6-27b"] < idle["qwen3.6-27b"]


def test_a_context_that_does_not_fit_is_refused_with_the_largest(gemma_facts):
    budget = card(24, 0.9)
    chosen = make_plan(PlanRequest(target=gemma_facts, budget=budget))
    asked = make_plan(PlanRequest(target=gemma_facts, budget=budget, ctx=chosen.largest_ctx + 4096))
    if chosen.largest_ctx + 4096 <= 32768:
        assert not asked.fits and "at most" in asked.reasons["ctx"]
    too_long = make_plan(PlanRequest(target=gemma_facts, budget=budget, ctx=65536))
    assert not too_long.fits and "trained for 32768" in too_long.reasons["ctx"]


def test_weights_that_do_not_fit_are_offloaded_by_layer(tmp_path):
    facts = facts_from_info(inspect_model(write_llama(tmp_path / "l.gguf", LLAMA_8B_HEADER)))
    small = card(6)
    plan = make_plan(PlanRequest(target=facts, budget=small))
    assert 0 <= plan.n_gpu_layers < 32
    assert plan.memory_bytes.weights < facts.weights_bytes


def test_a_preset_prices_sliding_window_layers_at_their_own_head_size():
    preset = parse_preset(Path("presets/gemma4-31b-24gb.toml").read_text(), "p")
    facts = facts_from_preset(preset.target, preset.native_ctx, preset.title)
    assert facts.full_kv_elems_per_token == 10 * 4 * 2 * 512
    assert facts.swa_kv_elems_per_token == 50 * 16 * 2 * 256
    assert facts.max_layer_kv_elems == 4 * 2 * 512
    assert facts.max_swa_layer_kv_elems == 16 * 2 * 256
    # Dequantizing for a quantized cache: the global layers over the whole context, the
    # sliding-window ones over their window only.
    ctx = 32768
    q8 = compute_bytes(facts, ctx, "q8_0") - compute_bytes(facts, ctx, "f16")
    assert q8 == int(max(ctx * 4096, 1536 * 8192) * 1.7)
    full = compute_bytes(facts, ctx, "q8_0", swa_full=True) - compute_bytes(facts, ctx, "f16")
    assert full == int(ctx * 8192 * 1.7)
    assert preset.draft is not None and preset.draft.model is not None
    assert preset.draft.model.facts.full_kv_layers == 0  # the assistant reads the target's KV


def test_sliding_window_checkpoints_are_bounded_by_the_pcs_ram():
    preset = parse_preset(Path("presets/gemma4-31b-24gb.toml").read_text(), "p")
    facts = facts_from_preset(preset.target, preset.native_ctx, preset.title)
    each = 50 * 16 * 2 * 256 * 1536 * 2  # the window's cells at f16: 1.2 GiB
    for ram_gib, wanted in ((32, 3), (128, 8), (4, 1)):
        budget = dataclasses.replace(card(24), host_total_bytes=ram_gib * GIB)
        plan = make_plan(PlanRequest(target=facts, budget=budget, checkpoints=True))
        assert not plan.swa_full and plan.context_checkpoints == wanted
        assert plan.memory_bytes.checkpoints == wanted * each
        assert "checkpoints of the sliding-window cache" in plan.reasons["checkpoints"]
    full = make_plan(PlanRequest(target=facts, budget=card(80), checkpoints=True, swa_full=True))
    assert full.context_checkpoints is None and full.memory_bytes.checkpoints == 0
    off = make_plan(PlanRequest(target=facts, budget=card(24), prompt_cache=False))
    assert off.server_flags()[-2:] == ["--ctx-checkpoints", "0"]


def test_an_moe_keeps_its_experts_on_the_cpu_for_an_agent_sized_context():
    preset = parse_preset(Path("presets/qwen36-35b-a3b-24gb.toml").read_text(), "p")
    facts = facts_from_preset(preset.target, preset.native_ctx, preset.title)
    assert facts.expert_bytes == int(preset.target.size_bytes * 0.9)
    plan = make_plan(PlanRequest(target=facts, budget=card(16)))
    assert plan.n_gpu_layers == -1 and 0 < plan.n_cpu_moe < facts.n_layer
    assert plan.fits and plan.ctx >= ENOUGH_CTX and plan.cache_type_k == "q8_0"
    assert "experts stay on the CPU" in plan.reasons["n_gpu_layers"]
    # The same bytes as dense layers: those offload only for the smallest usable context.
    dense = make_plan(
        PlanRequest(target=dataclasses.replace(facts, expert_bytes=0), budget=card(16))
    )
    assert dense.n_cpu_moe == 0 and dense.n_gpu_layers < facts.n_layer
    assert dense.ctx < ENOUGH_CTX


def test_an_moe_offloads_experts_for_the_context_asked_and_no_more():
    preset = parse_preset(Path("presets/qwen36-35b-a3b-24gb.toml").read_text(), "p")
    facts = facts_from_preset(preset.target, preset.native_ctx, preset.title)
    small_ask = make_plan(PlanRequest(target=facts, budget=card(24, free_gib=22.2), ctx=8192))
    assert small_ask.fits and small_ask.n_cpu_moe == 0
    large_ask = make_plan(PlanRequest(target=facts, budget=card(16), ctx=131072))
    assert large_ask.fits and large_ask.ctx == 131072 and large_ask.n_cpu_moe > 0


def test_a_preset_expert_share_is_a_share_of_the_file():
    text = Path("presets/qwen36-35b-a3b-24gb.toml").read_text()
    with pytest.raises(PresetError, match="share of the file"):
        parse_preset(text.replace("share = 0.9", "share = 1.5"), "presets/bad.toml")
    gemma = Path("presets/gemma4-31b-24gb.toml").read_text()
    with pytest.raises(PresetError, match="need 'swa_kv_layers'"):
        parse_preset(gemma.replace("swa_kv_layers = 50\n", ""), "presets/bad.toml")


def test_cpu_plan_keeps_everything_in_ram(gemma_facts):
    budget = GpuBudget("RAM", 16 * GIB, 12 * GIB, is_gpu=False)
    plan = make_plan(PlanRequest(target=gemma_facts, budget=budget))
    assert plan.n_gpu_layers == 0 and plan.memory_bytes.cuda_context == 0
    assert (
        "-ngl" in plan.server_flags()
        and plan.server_flags()[plan.server_flags().index("-ngl") + 1] == "0"
    )


@pytest.mark.parametrize(
    ("free_gib", "kib_per_token", "expected"),
    [(8.3, 14.0, 16384), (7.5, 20.0, 16384), (0.01, 20.0, 512), (1.0, 100.0, 5120)],
)
def test_kvflash_pool_rule(free_gib, kib_per_token, expected):
    pool = kvflash_pool(int(free_gib * GIB), 0, kib_per_token * 1024, 131072)
    assert pool == expected


def test_choose_preset_by_card():
    paths = resolve_paths()
    for gib, wanted in [
        (8, "qwen3-4b"),
        (12, "gemma3-12b"),
        (16, "gemma4-26b-a4b"),
        (24, "qwen3.6-27b-lucebox"),  # the tier's Lucebox sets first, the largest reported gain
        (32, "qwen3.6-27b-q6"),
    ]:
        best = table_for(card(gib), paths).best
        assert best is not None and best.alias == wanted
    cpu = GpuBudget("RAM", 24 * GIB, 20 * GIB, is_gpu=False)
    table = table_for(cpu, paths)
    # Without a GPU the default is the instruct model that chats, not the base smoke test.
    assert table.best is not None and table.best.alias == "smollm2"
    without_cpu_default = [p for p in table.plans if p.preset and not p.preset.cpu_default]
    fallback = choose_preset(without_cpu_default, cpu)
    assert fallback is not None and fallback.alias == "smoke"


LUCEBOX_PRESETS = ("qwen3.6-27b-lucebox", "gemma4-26b-a4b-lucebox", "gemma4-31b-lucebox")


def test_lucebox_variants_are_served_by_that_engine_only_where_it_can_serve():
    """On an NVIDIA card the Lucebox rows plan the Lucebox engine (DDTree on their draft) and
    one is the pick, off loopback too (lucebox's front holds the API key for either engine);
    without a GPU they fall to llama-server, and the pick is a llama-server row of the tier
    (never a set whose draft nothing can use)."""
    paths = resolve_paths()
    table = table_for(card(24), paths)
    rows = {p.alias: p for p in table.plans}
    for alias in LUCEBOX_PRESETS:
        assert rows[alias].engine_kind == "lucebox", alias
        assert rows[alias].speculation.spec_type == "ddtree"
    assert rows["qwen3.6-27b"].engine_kind == "llama-server"  # the MTP row stays the fallback
    assert table.best is not None and table.best.alias in LUCEBOX_PRESETS
    options = ServeOptions(host="0.0.0.0")
    shared = preset_table(paths, options, resolve(options, Settings()), card(24), installs_of())
    # Off loopback the Lucebox engine serves behind lucebox's front, which holds the key.
    assert {p.alias: p.engine_kind for p in shared.plans} == {
        p.alias: p.engine_kind for p in table.plans
    }
    assert shared.best is not None and shared.best.alias in LUCEBOX_PRESETS
    cpu = table_for(GpuBudget("RAM", 256 * GIB, 250 * GIB, is_gpu=False), paths)
    assert all(p.engine_kind == "llama-server" for p in cpu.plans)
    assert cpu.best is not None and cpu.best.alias not in LUCEBOX_PRESETS


def test_a_lucebox_variant_names_a_plain_target_and_a_lucebox_draft():
    presets = {p.id: p for p in load_presets(resolve_paths())}
    for alias in LUCEBOX_PRESETS:
        preset = presets[alias]
        assert preset.engine == "lucebox" and preset.draft and preset.draft.model
        assert preset.draft.model.source.startswith("hf:Lucebox/")
        assert preset.draft.model.facts.architecture.endswith("dflash-draft")
        assert "MTP" not in preset.target.source  # the engine's loader refuses the MTP block
        assert "Luce-Org/lucebox" in preset.evidence


@pytest.mark.slow
def test_cpu_default_preset_matches_its_real_file():
    """The published facts of the CPU default are the ones the real GGUF's header gives."""
    from lucebox.engine.models.presets import facts_from_preset
    from support.realmodels import SMOL_SIZE_BYTES, smol_model

    (preset,) = [p for p in load_presets(resolve_paths()) if p.cpu_default]
    assert preset.target.size_bytes == SMOL_SIZE_BYTES and not preset.target.size_is_estimate
    published = facts_from_preset(preset.target, preset.native_ctx, preset.title)
    real = facts_from_info(inspect_model(smol_model()))
    for field in ("architecture", "n_layer", "n_embd", "n_vocab", "native_ctx"):
        assert getattr(published, field) == getattr(real, field), field
    assert published.full_kv_elems_per_token == real.full_kv_elems_per_token


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("id = 3", "'id' should be str"),
        ("nonsense = 1", "unknown key"),
        ('id = "x"\ntitle = "t"', "missing key"),
        ("[[", "not valid TOML"),
        (
            'id = "x"\ntitle = "t"\nfamily = "f"\nvram_tier_gib = 8\nengine = "vllm"\n'
            'native_ctx = 4096\nevidence = "e"',
            "'engine' should be one of llama.cpp, lucebox",
        ),
    ],
)
def test_bad_preset_names_file_key_and_problem(text, fragment):
    with pytest.raises(PresetError, match=fragment) as caught:
        parse_preset(text, "presets/bad.toml")
    assert "presets/bad.toml" in str(caught.value)


_GEMMA3 = Path("presets/gemma3-12b-12gb.toml")
_PROJECTOR = (
    '\n[projector]\nsource = "hf:google/gemma-3-12b-it-qat-q4_0-gguf/mmproj-model-f16-12B.gguf"\n'
    'projector_type = "gemma3"\nsize_bytes = 854200224\nsize_is_estimate = true\n'
)


_FAMILY_PROJECTOR = {
    "gemma3": "gemma3",
    "gemma4": "gemma4v",
    "qwen3.6": "qwen3vl_merger",
    "qwen3.8": "qwen3vl_merger",
}
"""The projector type the pinned engine's converter writes for each family's vision tower."""


def _without_projector() -> str:
    return re.sub(r"\[projector\]\n(?:\w.*\n)*", "", _GEMMA3.read_text())


def test_a_preset_projector_table_is_parsed():
    text = _without_projector() + _PROJECTOR
    projector = parse_preset(text, "presets/p.toml").projector
    assert projector is not None
    assert projector.source.endswith("/mmproj-model-f16-12B.gguf")
    assert (projector.size_bytes, projector.size_is_estimate) == (854200224, True)
    assert projector.projector_type == "gemma3"
    shipped = {p.id: p.projector for p in load_presets(resolve_paths())}
    assert shipped["qwen3-4b"] is None  # text only
    assert shipped["gemma3-12b"] is not None and shipped["gemma3-12b"].size_is_estimate
    for preset in load_presets(resolve_paths()):
        if preset.projector is not None:  # the projector sits in the target's repo
            repo = preset.target.source.rsplit("/", 1)[0]
            assert preset.projector.source.startswith(repo + "/mmproj"), preset.id
            assert preset.projector.projector_type == _FAMILY_PROJECTOR[preset.family], preset.id


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (("size_bytes = 854200224\n", ""), r"\[projector\]: missing key 'size_bytes'"),
        (("size_is_estimate", "size_guess"), r"\[projector\]: unknown key\(s\) size_guess"),
        (("size_bytes = 854200224", 'size_bytes = "1"'), "'size_bytes' should be int"),
        (("hf:google/", "pypi:google/"), r"\[projector\]"),
        (('projector_type = "gemma3"\n', ""), r"\[projector\]: missing key 'projector_type'"),
        (('"gemma3"', '"mlp"'), "projector_type 'mlp' has no image shape to plan before the pull"),
        (('/mmproj-model-f16-12B.gguf"', '"'), r"\[projector\]"),
    ],
)
def test_a_bad_projector_table_names_the_file_table_and_key(change, fragment):
    text = _without_projector() + _PROJECTOR.replace(*change)
    with pytest.raises(PresetError, match=fragment) as caught:
        parse_preset(text, "presets/bad.toml")
    assert "presets/bad.toml [projector]" in str(caught.value)


def test_shipped_presets_are_valid_and_cover_every_tier():
    presets = load_presets(resolve_paths())
    tiers = {p.vram_tier_gib for p in presets}
    assert {0, 8, 12, 16, 24, 32} <= tiers
    smoke = next(p for p in presets if p.id == "smoke")
    assert smoke.smoke_test and smoke.chat_template == "gemma" and smoke.target.base_model
    assert all(p.evidence for p in presets)


def _gpus(*cards: tuple[float, float]) -> GpuBudget:
    """NVML-probed GPUs: (total GiB, GiB other programs hold) per card."""
    fakes = [
        FakeGpu(total_bytes=int(total * GIB), used_bytes=int(used * GIB)) for total, used in cards
    ]
    return budget_for(probe_gpus(FakeNvml(gpus=fakes)))


def _launch(budget: GpuBudget, preset: str):
    from lucebox.engine.models.presets import find_preset
    from lucebox.engine.plan.planner import plan_launch

    paths = resolve_paths()
    return plan_launch(
        paths,
        ServeOptions(preset=preset),
        resolved=resolve(ServeOptions(preset=preset), Settings()),
        budget=budget,
        installs=installs_of(),
        preset=find_preset(paths, preset),
    )


@pytest.mark.parametrize(
    ("cards", "preset", "split"),
    [
        # Fits one 24 GB card, but the split buys over 1.5x the context: split (issue 29).
        (((24, 0.3), (24, 0.3)), "qwen3.6-27b-q6", True),
        (((24, 0.3), (24, 0.3)), "qwen3-14b", False),  # native context on one card already
        (((24, 0.3), (12, 0.3)), "qwen3.6-27b", True),
        (((16, 0.3), (16, 0.3), (16, 0.3)), "qwen3.6-27b-q6", True),
        (((24, 22.5), (24, 0.3)), "qwen3.6-27b", False),  # the busy card is passed over
        (((12, 0.3), (12, 0.3)), "qwen3.6-27b", True),
    ],
)
def test_split_planner_on_scripted_cards(cards, preset, split):
    budget = _gpus(*cards)
    launch = _launch(budget, preset)
    plan = launch.plan
    assert launch.refusal is None, launch.refusal
    argv, env = launch.argv, launch.to_json()["env"]
    devices = launch.to_json()["devices"]
    assert sum(d["memory_bytes"] for d in devices) == pytest.approx(
        plan.memory_bytes.total, abs=len(devices)
    )
    if split:
        assert len(plan.tensor_split) == len(cards) and "--tensor-split" in argv
        assert argv[argv.index("--split-mode") + 1] == "layer"
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(str(i) for i in range(len(cards)))
        for device, (total, used) in zip(devices, cards, strict=True):
            assert device["memory_bytes"] <= (total - used) * GIB  # each card holds its share
        assert "spread over" in plan.reasons["split"]
        # Where one card holds the model, the split is chosen only for what it buys.
        holds_one = cards[0][0] == 24
        assert (">= 1.5x" in plan.reasons["split"]) == holds_one
    else:
        assert "--tensor-split" not in argv and "alone: no split" in plan.reasons["split"]
        assert "under 1.5x" in plan.reasons["split"]
        assert len(devices) == 1
        chosen = env["CUDA_VISIBLE_DEVICES"]
        free = {str(i): (t - u) for i, (t, u) in enumerate(cards)}
        assert free[chosen] == max(free.values())


def test_a_gpu_that_does_not_exist_is_a_usage_error():
    from lucebox.engine.core.errors import UsageError

    with pytest.raises(UsageError, match="there is no GPU 2"):
        budget_for(probe_gpus(FakeNvml(gpus=[FakeGpu(), FakeGpu()])), gpus=(2,))


def test_two_cards_reach_the_row_their_sum_is_made_for():
    budget = _gpus((24, 0.3), (24, 0.3))
    table = table_for(budget)
    assert table.best is not None and table.best.alias == "qwen3.6-27b-q6"


def test_a_context_past_the_native_one_is_refused_and_weighed_as_the_native_one(gemma_facts):
    # A card where q8_0 holds the native 32K and f16 does not: asking 64K weighs KV types for
    # the 32K the model can use, and the plan is refused with the native maximum named.
    native = gemma_facts.native_ctx
    budget = card(1415 / 1024)
    at_native = make_plan(PlanRequest(target=gemma_facts, budget=budget, ctx=native))
    too_long = make_plan(PlanRequest(target=gemma_facts, budget=budget, ctx=2 * native))
    assert at_native.fits and at_native.cache_type_k == "q8_0"
    assert not too_long.fits
    assert too_long.cache_type_k == at_native.cache_type_k
    assert f"ask for at most {native}" in too_long.reasons["ctx"]


def test_a_split_over_local_gpus_holds_two_compute_buffers_per_card():
    """llama-server runs a split over this PC's GPUs as a pipeline: each card held about twice
    the one-card compute buffer on two H200s
    (benchmarks/results/h200x2-two-gpus-planned-vs-run.json); an RPC peer turns the pipeline off."""
    from lucebox.engine.plan.memory.sizes import compute_copies
    from tests.engine.machine.test_peers import _budget, _peer

    assert compute_copies(_budget(((24, 0.3),), ())) == 1
    assert compute_copies(_budget(((24, 0.3), (24, 0.3)), ())) == 4
    with_peer = _budget(((24, 0.3),), (_peer("127.0.0.2:50052", 24, 0.3),))
    assert compute_copies(with_peer) == 2
