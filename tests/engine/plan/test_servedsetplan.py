"""The set planner: sets of shipped presets x budgets, the two-card choice, the router's files."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from lucebox.engine.core.errors import GuardRefusal, UsageError
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.core.units import MIB
from lucebox.engine.machine.budget import GpuBudget, budget_for
from lucebox.engine.machine.config import Settings, settings_from_toml
from lucebox.engine.machine.gpu import probe_gpus
from lucebox.engine.plan.launch import server_argv
from lucebox.engine.plan.memory.sizes import CTX_PAD
from lucebox.engine.plan.options import ServeOptions
from lucebox.engine.plan.planner import installs_of
from lucebox.engine.plan.servedset.memberreplan import respecced_set, smaller_context_set
from lucebox.engine.plan.servedset.router import router_ini, router_launch, section_options
from lucebox.engine.plan.servedset.servedsetplan import plan_set
from lucebox.engine.plan.servedset.setplan import SetPlan
from lucebox.engine.plan.speculation.specguard import Decision
from lucebox.engine.run.calibrate.calibrator import running_label
from lucebox.engine.runstart import keep_guard_off
from lucebox.engine.servedset import placements_of
from support.bertgguf import minilm_model
from support.ggufgen import ModelSpec as GeneratedModel
from support.ggufgen import cached_gguf
from tests.engine.fake_nvml import FakeNvml


def _budget(vram_mib: tuple[int, ...]) -> GpuBudget:
    return budget_for(probe_gpus(FakeNvml(gpus=[])), vram_mib=vram_mib)


def _plan(sources: tuple[str, ...], budget: GpuBudget, **options: object) -> SetPlan:
    return plan_set(
        resolve_paths(),
        ServeOptions(models=sources, **options),  # type: ignore[arg-type]
        sources,
        settings=Settings(),
        budget=budget,
        installs=installs_of(),
    )


SMALL_PAIR = ("qwen3-4b", "smollm2")
MID_PAIR = ("qwen3-4b", "qwen3-14b")
BIG_PAIR = ("qwen3.6-27b", "qwen3-4b")
BIG_TRIO = ("qwen3.6-27b-q6", "qwen3.6-27b", "gemma3-12b")
SLOTS = Path("/slots/sets/pair")
"""The set's folder of slot files, as its preset sections name it."""


@pytest.mark.parametrize(
    ("sources", "vram_mib", "models_max"),
    [
        (SMALL_PAIR, (8192,), 2),
        (SMALL_PAIR, (24576,), 2),
        (SMALL_PAIR, (24576, 24576), 2),
        (MID_PAIR, (8192,), 1),  # the 14B alone fills an 8 GB card
        (MID_PAIR, (24576,), 2),
        (MID_PAIR, (24576, 24576), 2),
        (BIG_PAIR, (8192,), 1),
        (BIG_PAIR, (24576,), 2),
        (BIG_PAIR, (24576, 24576), 2),
        (BIG_TRIO, (8192,), 1),
        (BIG_TRIO, (24576,), 1),
        # Two of the three share a card one at a time: the router's count limit is global,
        # so the set is held to one loaded model although the other card is free.
        (BIG_TRIO, (24576, 24576), 1),
    ],
)
def test_any_models_max_of_the_set_fit_together(sources, vram_mib, models_max):
    budget = _budget(vram_mib)
    planned = _plan(sources, budget)
    assert planned.fits and planned.models_max == models_max, planned.reasons
    assert planned.aliases == sources
    assert all(launch.refusal is None for launch in planned.launches)
    document = planned.to_json()
    assert set(document) >= {"models", "models_max", "fits", "reasons"}
    assert [m["alias"] for m in document["models"]] == list(sources)
    # Every combination of models_max models fits each device's free memory.
    for combo in itertools.combinations(planned.launches, planned.models_max):
        for index, device in enumerate(budget.devices):
            on_device = [
                lp.plan.memory_bytes.total
                for lp in combo
                if lp.server.gpus == (index,) or len(vram_mib) == 1
            ]
            assert sum(on_device) <= device.vram_free_bytes


def test_two_cards_give_each_model_a_card_and_say_why():
    planned = _plan(BIG_PAIR, _budget((24576, 24576)))
    big, small = planned.launches
    assert {big.server.gpus, small.server.gpus} == {(0,), (1,)}
    assert "--tensor-split" not in big.argv
    assert "the other cards serve qwen3-4b" in big.plan.reasons["split"]
    # Alone on a card it gets more than it would sharing one card with the small model.
    shared = _plan(BIG_PAIR, _budget((24576,))).launches[0]
    assert big.plan.ctx > shared.plan.ctx


def test_a_model_no_card_holds_alone_has_the_set_over_all_cards():
    planned = _plan(("qwen3.6-27b-q6", "smollm2"), _budget((16384, 16384)))
    assert planned.fits
    big = planned.launches[0]
    assert big.plan.tensor_split and "fits no card alone" in big.plan.reasons["device"]


def test_a_set_that_cannot_fit_even_one_at_a_time_is_refused_with_numbers():
    planned = _plan(("qwen3-4b", "smollm2"), _budget((1024,)))
    assert not planned.fits and planned.refusal is not None
    assert (
        "qwen3-4b needs" in planned.refusal.message and "1.00 GiB free" in planned.refusal.message
    )
    assert planned.refusal.exit_code == 3


def test_a_model_named_twice_and_a_draft_are_usage_errors():
    with pytest.raises(UsageError, match="twice"):
        _plan(("smollm2", "smollm2"), _budget((8192,)))
    with pytest.raises(UsageError, match="--draft"):
        _plan(SMALL_PAIR, _budget((8192,)), draft="smollm2")


def test_a_ram_limit_holds_one_model_at_a_time():
    cpu = GpuBudget("CPU (no NVIDIA GPU): system RAM", 64 * 1024 * MIB, 48 * 1024 * MIB, False)
    sources = ("smollm2", "smoke")
    free = plan_set(
        resolve_paths(), ServeOptions(models=sources), sources,
        settings=Settings(), budget=cpu, installs=installs_of(),
    )  # fmt: skip
    assert free.models_max == 2
    limited = plan_set(
        resolve_paths(), ServeOptions(models=sources), sources,
        settings=Settings(), budget=cpu, installs=installs_of(), ram_limit_bytes=1000 * MIB,
    )  # fmt: skip
    assert limited.models_max == 1 and limited.fits
    # Each model with its own process and the router's fits the limit.
    process = limited.process_bytes
    assert process == 40 * MIB
    assert all(lp.plan.memory_bytes.total + 2 * process <= 1000 * MIB for lp in limited.launches)


def test_router_ini_carries_each_plan_and_the_router_only_router_flags():
    planned = _plan(BIG_PAIR, _budget((24576, 24576)))
    text = router_ini(planned, SLOTS)
    # The router's own sleep stays off: lucebox's proxy unloads an idle model, saved first.
    assert "[*]" not in text and "sleep-idle-seconds" not in text
    for launch in planned.launches:
        section = text.split(f"[{launch.alias}]\n", 1)[1].split("\n\n", 1)[0]
        keys = dict(line.split(" = ", 1) for line in section.splitlines())
        assert keys["m"] == launch.server.model_path
        assert keys["c"] == str(launch.plan.ctx)
        assert keys["ctk"] == launch.plan.cache_type_k
        assert keys["jinja"] == "true" and keys["metrics"] == "true"
        assert keys["device"] == f"CUDA{launch.server.gpus[0]}"
        assert not {"host", "port", "alias", "api-key-file"} & set(keys)
        assert keys["slot-save-path"] == str(SLOTS)
    spec = router_launch(planned, "/run/router.ini")
    argv = server_argv(spec)
    assert argv[1:] == [
        "--host", "127.0.0.1", "--port", "8080",
        "--models-preset", "/run/router.ini", "--models-max", "2",
    ]  # fmt: skip
    assert spec.gpus == (0, 1)


def _section(ini_text: str, alias: str) -> dict[str, str]:
    section = ini_text.split(f"[{alias}]\n", 1)[1].split("\n\n", 1)[0]
    return dict(line.split(" = ", 1) for line in section.splitlines())


def test_a_member_out_of_memory_is_planned_again_at_three_quarters_the_others_kept():
    planned = _plan(BIG_PAIR, _budget((24576, 24576)))
    big, small = planned.launches
    smaller = smaller_context_set(resolve_paths(), planned, big.alias, Settings())
    replanned, kept = smaller.launches
    assert kept is small and smaller.models_max == planned.models_max
    assert replanned.plan.ctx == big.plan.ctx * 3 // 4 // CTX_PAD * CTX_PAD
    assert "out of memory" in replanned.plan.reasons["ctx"]
    assert replanned.plan.reasons["split"] == big.plan.reasons["split"]  # still on its card
    assert replanned.server.gpus == big.server.gpus
    assert f"at {big.plan.ctx} tokens" in smaller.reasons[big.alias]
    # The proxy's bytes and the router's file follow the new plan; the other model's do not.
    before, _ = placements_of(planned)
    after, _ = placements_of(smaller)
    assert after[big.alias].planned_bytes < before[big.alias].planned_bytes
    assert after[small.alias] == before[small.alias]
    old_ini, new_ini = router_ini(planned, SLOTS), router_ini(smaller, SLOTS)
    assert _section(new_ini, big.alias)["c"] == str(replanned.plan.ctx)
    assert _section(new_ini, small.alias) == _section(old_ini, small.alias)


def test_a_member_context_the_user_asked_for_is_refused_not_shrunk():
    planned = _plan(SMALL_PAIR, _budget((24576,)), ctx=16384)
    with pytest.raises(GuardRefusal, match="16384-token context you asked for") as refused:
        smaller_context_set(resolve_paths(), planned, "smollm2", Settings())
    assert refused.value.exit_code == 3


def test_a_member_of_a_ram_limited_set_is_planned_again_within_the_limit():
    cpu = GpuBudget("CPU (no NVIDIA GPU): system RAM", 64 * 1024 * MIB, 48 * 1024 * MIB, False)
    sources = ("smollm2", "smoke")
    limited = plan_set(
        resolve_paths(), ServeOptions(models=sources), sources,
        settings=Settings(), budget=cpu, installs=installs_of(), ram_limit_bytes=1000 * MIB,
    )  # fmt: skip
    smoke = limited.launches[1]
    smaller = smaller_context_set(resolve_paths(), limited, "smoke", Settings())
    replanned = smaller.launches[1]
    assert replanned.plan.ctx == smoke.plan.ctx * 3 // 4 // CTX_PAD * CTX_PAD
    # What the PC keeps stays the limit's, not the settings' rule for a whole machine.
    assert replanned.resolved.keep_free_ram_bytes == smoke.resolved.keep_free_ram_bytes
    assert replanned.plan.memory_bytes.total < smoke.plan.memory_bytes.total


def test_section_options_refuse_what_the_ini_cannot_hold():
    with pytest.raises(UsageError, match="preset file"):
        section_options(["llama-server", "-m", "/models/a;b.gguf"])
    assert section_options(["s", "-c", "4096", "--swa-full", "--port", "1"]) == [
        ("c", "4096"),
        ("swa-full", "true"),
    ]
    # Several users: the slots and their shared pool reach each model's section.
    assert section_options(["s", "-np", "4", "--kv-unified", "--cache-ram", "720"]) == [
        ("np", "4"),
        ("kv-unified", "true"),
        ("cache-ram", "720"),
    ]


def test_models_settings_parse():
    text = '[models]\nserved = ["smollm2", "smoke"]\nidle_s = 30\nram_mib = 900\n'
    settings = settings_from_toml(Path("config.toml"), text)
    assert settings.models_served == ("smollm2", "smoke")
    assert settings.models_idle_s == 30 and settings.models_ram_mib == 900


def test_the_proxy_keeps_a_model_per_card_where_a_count_would_keep_one_in_all():
    from lucebox.engine.run.servedset.admission import evictions
    from lucebox.engine.servedset import placements_of

    planned = _plan(BIG_TRIO, _budget((24576, 24576)))
    assert planned.models_max == 1
    placements, room = placements_of(planned)
    q6, q4, gemma = BIG_TRIO
    assert placements[q6].device != placements[q4].device == placements[gemma].device
    assert evictions(q4, frozenset({q6}), placements, room, {}) == ()
    assert evictions(gemma, frozenset({q6, q4}), placements, room, {}) == (q4,)


def test_a_member_the_guard_decides_on_is_planned_again_the_others_kept():
    planned = _plan(BIG_PAIR, _budget((24576,)))
    mtp, small = planned.launches
    assert mtp.server.spec_type == "draft-mtp" and mtp.server.draft_max == 3
    shorter = Decision("shorten", 0.1, 2, "10% accepted; drafts shortened to 2 tokens", "seen")
    shortened = respecced_set(resolve_paths(), planned, mtp.alias, Settings(), shorter)
    replanned, kept = shortened.launches
    assert kept is small and shortened.models_max == planned.models_max
    assert replanned.server.spec_type == "draft-mtp" and replanned.server.draft_max == 2
    assert replanned.plan.reasons["device"] == mtp.plan.reasons["device"]
    assert shortened.reasons[mtp.alias] == shorter.reason
    assert _section(router_ini(shortened, SLOTS), mtp.alias)["spec-draft-n-max"] == "2"
    off = Decision("off", 0.05, None, "5% accepted; speculation switched off", "seen")
    without = respecced_set(resolve_paths(), shortened, mtp.alias, Settings(), off)
    assert without.launches[0].server.spec_type is None and without.launches[1] is small
    new_ini = router_ini(without, SLOTS)
    assert "spec-type" not in _section(new_ini, mtp.alias)
    assert _section(new_ini, small.alias) == _section(router_ini(planned, SLOTS), small.alias)


def test_a_member_switched_off_by_the_guard_is_planned_off_when_the_set_starts_again(
    lucebox_home,
):
    cpu = GpuBudget("CPU (no NVIDIA GPU): system RAM", 64 * 1024 * MIB, 48 * 1024 * MIB, False)
    sources = (str(cached_gguf(GeneratedModel())), "smollm2")

    def planned_set() -> SetPlan:
        return plan_set(
            resolve_paths(), ServeOptions(models=sources), sources,
            settings=Settings(), budget=cpu, installs=installs_of(),
        )  # fmt: skip

    first = planned_set()
    member = first.launches[0]
    assert member.server.spec_type == "ngram-mod"
    assert member.speculation.measurement_key is not None  # its file is here: the store keys it
    why = "20% of 300 drafted tokens accepted; speculation switched off"
    keep_guard_off(resolve_paths(), member, running_label(member.server), why)
    again = planned_set()
    assert again.launches[0].server.spec_type is None
    assert f"switched off by the guard while serving: {why}" in again.launches[0].speculation.reason
    assert again.launches[1].server.spec_type == first.launches[1].server.spec_type


def _cpu(mib: int) -> GpuBudget:
    return GpuBudget("CPU (no NVIDIA GPU): system RAM", mib * MIB, mib * MIB, False)


def test_a_side_model_beside_a_set_takes_what_the_set_leaves_and_says_so():
    pair = ("smollm2", "smoke")
    alone = _plan(pair, _cpu(48 * 1024))
    planned = _plan(pair, _cpu(48 * 1024), embed_model=str(minilm_model()))
    assert planned.fits
    (side,) = planned.sides.models
    assert side.role == "embeddings" and side.alias == "all-MiniLM-L6-v2-F16"
    assert 45 * MIB < side.memory_bytes <= planned.sides.headroom_bytes
    # The set keeps every byte it planned without it: its models, contexts and count.
    assert [lp.plan for lp in planned.launches] == [lp.plan for lp in alone.launches]
    assert planned.models_max == alone.models_max
    shown = planned.to_json()["side_models"][0]
    assert shown["memory_bytes"]["total"] == side.memory_bytes
    # The proxy loads the set's models into what the side model leaves.
    assert placements_of(planned)[1]["ram"] == placements_of(alone)[1]["ram"] - side.memory_bytes
    assert all(not lp.sides.models for lp in planned.launches)  # planned once, by the set


def test_a_side_model_the_set_leaves_no_room_for_refuses_the_set_with_the_numbers():
    planned = _plan(("smollm2", "smoke"), _cpu(3100), embed_model=str(minilm_model()))
    assert planned.refusal is not None and not planned.fits
    message = planned.refusal.message
    assert "needs 93 MiB of RAM, but the set's plan leaves 31 MiB" in message
    assert "the set keeps its memory" in message
    assert planned.sides.headroom_bytes < planned.sides.models[0].memory_bytes
