"""The Lucebox engine on two GPUs: each placement planned per card, the choice between them, and
the device flags, on the generated qwen35 target and its Lucebox draft
(benchmarks/lucebox_models.py).

The builds' flag contracts are their real ``--help`` texts: 62880e20's as the engine printed it
on the H100, 4cf58a04's its usage text from the pinned source (it adds --target-split-mode).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from benchmarks.lucebox_models import DRAFT, TARGET
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.core.units import GIB, MIB
from lucebox.engine.engines import lucebox as lucebox_sources
from lucebox.engine.engines.luceboxbuild import capabilities_of
from lucebox.engine.machine.budget import DeviceBudget, GpuBudget, pool_of
from lucebox.engine.machine.config import Settings
from lucebox.engine.models.gguf import read_header
from lucebox.engine.models.headerinfo import info_from_header
from lucebox.engine.models.modelfacts import ModelFacts, facts_from_info
from lucebox.engine.plan.engineview import EngineView
from lucebox.engine.plan.launch import server_env
from lucebox.engine.plan.lucebox import luceboxroute
from lucebox.engine.plan.lucebox.luceboxdevices import (
    PLACEMENTS,
    Candidate,
    PlacementName,
    choose_placement,
    offered,
)
from lucebox.engine.plan.lucebox.luceboxfit import build_memory
from lucebox.engine.plan.lucebox.luceboxplan import (
    DRAFT_RUNTIME_BYTES,
    LuceboxRequest,
    plan_lucebox,
)
from lucebox.engine.plan.memory.sizes import CUDA_CONTEXT_BYTES
from lucebox.engine.plan.options import ServeOptions, resolve
from lucebox.engine.plan.placementrates import (
    placement_key,
    read_placement_rates,
    write_placement_rate,
)
from lucebox.engine.plan.planner import installs_of, plan_launch
from support.ggufgen import cached_gguf

FIXTURES = Path(__file__).parents[1] / "fixtures" / "lucebox"
HELP_62880E20 = (FIXTURES / "help.txt").read_text()
HELP_4CF58A04 = (FIXTURES / "help-4cf58a04.txt").read_text()
CTX = 262144


VERSION_OF = {
    HELP_62880E20: "luce-dflash 62880e20 (2026-07-20)",
    HELP_4CF58A04: "luce-dflash 4cf58a04 (2026-08-11)",
}
"""The version string each build's manifest carries: it picks the build's memory fit."""


def build(help_text: str) -> EngineView:
    caps = capabilities_of(help_text, b"--kvflash", None, symmetric_only=True)
    return EngineView("lucebox-test", VERSION_OF[help_text], "dflash_server", caps)


@pytest.fixture(scope="module")
def files() -> tuple[Path, Path]:
    target = cached_gguf(dataclasses.replace(TARGET, header_only=True))
    draft = cached_gguf(dataclasses.replace(DRAFT, header_only=True))
    return target, draft


def facts(path: Path) -> ModelFacts:
    return facts_from_info(info_from_header(read_header(path), str(path), 0))


def two_cards(free_mib: int, second_free_mib: int | None = None) -> GpuBudget:
    frees = (free_mib, second_free_mib or free_mib)
    cards = tuple(
        DeviceBudget(i, "NVIDIA GeForce RTX 3090", 24 * GIB, mib * MIB)
        for i, mib in enumerate(frees)
    )
    return pool_of(cards, 64 * GIB)


def plan_on(files, budget, help_text, **options):
    target, draft = files
    serve = ServeOptions(model=str(target), draft=str(draft), engine="lucebox", **options)
    paths = resolve_paths()
    return plan_launch(
        paths, serve, resolved=resolve(serve, Settings()), budget=budget,
        installs=dataclasses.replace(installs_of(), lucebox=build(help_text)),
    )  # fmt: skip


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_each_placement_is_planned_per_card(files, placement: PlacementName):
    """Per card, from the same terms: the draft's card holds its CUDA context, the draft and
    its graphs; tensor parallel mirrors the output matrix and halves the layers and the KV."""
    target, draft = facts(files[0]), facts(files[1])
    cards = (("GPU 0: A", 20 * GIB), ("GPU 1: B", 20 * GIB))
    budget = two_cards(20 * 1024)

    def planned(name: PlacementName):
        used = cards[:1] if name == "one" else cards
        request = LuceboxRequest(
            target=target, budget=budget, draft=draft, ctx=32768, placement=name, cards=used
        )
        return plan_lucebox(request)

    one, this = planned("one"), planned(placement)
    devices = this.plan.device_bytes
    assert sum(b for _, b in devices) == this.plan.memory_bytes.total
    assert this.plan.ctx == one.plan.ctx == 32768 and this.exact
    assert this.flags.placement == placement
    attention_kv = one.plan.memory_bytes.kv - target.recurrent_state_bytes
    if placement == "one":
        assert devices == (("GPU 0: A", one.plan.memory_bytes.total),)
        assert "devices" not in this.reasons
        return
    assert [name for name, _ in devices] == ["GPU 0: A", "GPU 1: B"]
    assert this.reasons["devices"].startswith(
        {"draft-apart": "the draft on the second card", "tensor": "tensor parallel"}[placement]
    )
    draft_part = draft.weights_bytes + DRAFT_RUNTIME_BYTES
    if placement == "draft-apart":
        assert devices[1][1] == CUDA_CONTEXT_BYTES + draft_part
        assert devices[0][1] == one.plan.memory_bytes.total - draft_part
        return
    gpu_weights = target.weights_bytes - target.host_bytes
    half_layers = target.layer_bytes // 2
    assert this.plan.memory_bytes.weights == 2 * (gpu_weights - target.layer_bytes + half_layers)
    # The draft stays on the first card; the KV and the rest split evenly.
    assert abs(devices[0][1] - devices[1][1] - draft_part) <= target.recurrent_state_bytes
    assert this.plan.memory_bytes.kv == one.plan.memory_bytes.kv
    assert this.plan.memory_bytes.cuda_context == 2 * CUDA_CONTEXT_BYTES
    assert devices[1][1] < one.plan.memory_bytes.total - attention_kv // 2 + CUDA_CONTEXT_BYTES


def test_one_card_that_holds_the_context_serves_alone(files):
    launch = plan_on(files, two_cards(4000, 6000), HELP_4CF58A04, ctx=CTX)
    assert launch.refusal is None
    assert launch.server.gpus == (1,)  # the card with the most free memory
    assert launch.to_json()["placement"] == "one"
    reason = launch.plan.reasons["placement"]
    assert reason.startswith("one card: it holds 262144 tokens exactly")
    assert "not measured" in reason and "prior" in reason
    for flag in ("--target-device", "--draft-device", "--target-devices", "--peer-access"):
        assert flag not in launch.argv


def test_the_draft_moves_to_the_second_card_when_that_buys_the_context(files):
    """2,500 MiB free on each card: one card holds 121,088 tokens exactly; with the draft on
    the other the first holds all 262,144 (tensor parallel holds none: on 4cf58a04 it costs
    840 MiB more per card, more than half this small target's layers)."""
    launch = plan_on(files, two_cards(2500, 2490), HELP_4CF58A04, ctx=CTX)
    assert launch.refusal is None and launch.plan.kvflash_pool_tokens is None
    assert launch.server.gpus == (0, 1)
    assert server_env(launch.server)["CUDA_VISIBLE_DEVICES"] == "0,1"
    argv = launch.argv
    assert argv[argv.index("--target-device") + 1] == "cuda:0"
    assert argv[argv.index("--draft-device") + 1] == "cuda:1"
    assert "--peer-access" in argv and "--target-split-mode" not in argv
    assert launch.plan.reasons["placement"].startswith("the draft on the second card")
    assert len(launch.to_json()["devices"]) == 2


@pytest.fixture(scope="module")
def deep_files(files) -> tuple[Path, Path]:
    """The target with 32 layers and a wider FFN (1.8 GiB of layers): enough weights that
    splitting them pays for tensor parallel's own buffers."""
    deep = dataclasses.replace(TARGET, n_layer=32, n_ff=8192, header_only=True)
    return cached_gguf(deep), files[1]


def test_tensor_parallel_when_only_it_holds_the_context(deep_files):
    """4,600 MiB free on each card: one card and the draft apart hold 262,144 tokens only with
    a KVFlash pool; tensor parallel holds them exactly."""
    launch = plan_on(deep_files, two_cards(4600), HELP_4CF58A04, ctx=CTX)
    assert launch.refusal is None and launch.plan.ctx == CTX
    assert launch.plan.kvflash_pool_tokens is None
    argv = launch.argv
    assert argv[argv.index("--target-devices") + 1] == "cuda:0,cuda:1"
    assert argv[argv.index("--target-split-mode") + 1] == "tensor"
    assert "--draft-device" not in argv
    assert launch.plan.reasons["placement"].startswith("tensor parallel across both cards")
    devices = launch.to_json()["devices"]
    assert [d["name"] for d in devices] == ["GPU 0: NVIDIA GeForce RTX 3090",
                                            "GPU 1: NVIDIA GeForce RTX 3090"]  # fmt: skip
    assert all(d["memory_bytes"] < 4600 * MIB for d in devices)


def test_a_build_without_the_tensor_flag_never_gets_it(files):
    """62880e20's --help has --draft-device but no --target-split-mode: the cards where only
    tensor parallel holds the context get the draft apart and a KVFlash pool instead, and
    --placement tensor is refused."""
    caps = build(HELP_62880E20).capabilities
    assert "draft-device" in caps.features and "target-split-mode" not in caps.features
    assert "tensor" not in offered(caps.features, 2, True, "qwen35", False)
    auto = plan_on(files, two_cards(2925), HELP_62880E20, ctx=CTX)
    assert "--target-split-mode" not in auto.argv and "--target-devices" not in auto.argv
    assert auto.plan.kvflash_pool_tokens is not None
    asked = plan_on(files, two_cards(2925), HELP_62880E20, ctx=CTX,
                    placement="tensor")  # fmt: skip
    assert asked.refusal is not None and "--placement tensor" in str(asked.refusal)
    assert "--target-split-mode" not in asked.argv


def test_placement_as_asked(files):
    launch = plan_on(files, two_cards(8000), HELP_4CF58A04, ctx=32768,
                     placement="tensor")  # fmt: skip
    assert launch.refusal is None and "--target-split-mode" in launch.argv
    assert launch.plan.reasons["placement"].startswith("tensor parallel across both cards: as")


def test_measured_decode_decides_among_those_that_hold_the_context(files):
    budget = two_cards(8000)
    first = plan_on(files, budget, HELP_4CF58A04, ctx=32768)
    assert first.to_json()["placement"] == "one"
    paths = resolve_paths()
    target, draft = files
    labels = ("GPU 0: NVIDIA GeForce RTX 3090", "GPU 1: NVIDIA GeForce RTX 3090")
    key = placement_key(target, draft, "lucebox-test", labels)
    write_placement_rate(paths, key, "one", 410.0)
    write_placement_rate(paths, key, "tensor", 520.0)
    assert read_placement_rates(paths, key) == {"one": 410.0, "tensor": 520.0}
    again = plan_on(files, budget, HELP_4CF58A04, ctx=32768)
    assert again.to_json()["placement"] == "tensor"
    assert "the fastest measured" in again.plan.reasons["placement"]
    assert "520 tok/s measured" in again.plan.reasons["placement"]


def test_choose_placement_rules():
    one = Candidate("one", True, False, 100_000)
    apart = Candidate("draft-apart", True, True, 262_144)
    tensor = Candidate("tensor", True, True, 262_144)
    assert choose_placement([one, apart, tensor], CTX)[0] is apart
    fast = dataclasses.replace(tensor, decode_tok_s=300.0)
    slow = dataclasses.replace(apart, decode_tok_s=250.0)
    assert choose_placement([one, slow, fast], CTX)[0] is fast
    # Measured but not holding the context: the rate does not count.
    quick = dataclasses.replace(one, decode_tok_s=900.0)
    assert choose_placement([quick, apart], CTX)[0] is apart
    # Within the margin the one earlier in the prior's order keeps it (it frees a card).
    exact_one = dataclasses.replace(one, exact=True, ctx=262_144, decode_tok_s=2909.0)
    near = dataclasses.replace(apart, decode_tok_s=3024.0)
    assert choose_placement([exact_one, near], CTX)[0] is exact_one
    clear = dataclasses.replace(apart, decode_tok_s=3100.0)
    assert choose_placement([exact_one, clear], CTX)[0] is clear
    short = [one, Candidate("tensor", True, False, 180_000)]
    best, why = choose_placement(short, CTX)
    assert best.name == "tensor" and "buys the most context" in why
    none = [Candidate("one", False, False, 0), Candidate("tensor", False, False, 0)]
    assert choose_placement(none, CTX)[0].name == "one"


def test_offered_needs_two_cards_a_draft_for_the_draft_apart_and_no_pflash_for_tensor():
    features = ("draft-device", "target-split-mode")
    assert offered(features, 1, True, "qwen35", False) == ("one",)
    assert offered(features, 2, False, "qwen35", False) == ("one", "tensor")
    assert offered(features, 2, True, "gemma4", False) == ("one", "draft-apart")
    assert offered(features, 2, True, "qwen35", True) == ("one", "draft-apart")


def fit_runs() -> list[dict]:
    """The 4cf58a04 build on two H200s as `benchmarks/device/drive.sh lucebox_memory_by_stage fit`
    recorded it: NVML's reading of the engine process per card after each request and the peak in
    between."""
    lines = (FIXTURES / "fit-4cf58a04.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("run", fit_runs(), ids=lambda run: run["name"])
def test_the_4cf58a04_fit_plans_each_card_within_5_percent(files, run):
    """One card at 4K and 32K tokens, with and without the draft, and tensor parallel across
    two: each card's plan against what it held after the requests, and the peak the plan
    must cover (a one-card run also held a bare CUDA context on the card it did not use: it
    saw both, lucebox shows it one)."""
    target, draft = facts(files[0]), facts(files[1])
    argv = run["argv"]
    ctx = int(argv[argv.index("--max-ctx") + 1])
    placement: PlacementName = "tensor" if "--target-split-mode" in argv else "one"
    free = 143156 * MIB
    cards = (("GPU 0: NVIDIA H200", free), ("GPU 1: NVIDIA H200", free))
    request = LuceboxRequest(
        target=target,
        budget=pool_of(tuple(DeviceBudget(i, "NVIDIA H200", 143771 * MIB, free)
                             for i in range(2)), 128 * GIB),
        draft=draft if "--draft" in argv else None,
        ctx=ctx,
        placement=placement,
        cards=cards if placement == "tensor" else cards[:1],
        build=build_memory("luce-dflash 4cf58a04 (2026-08-11)"),
    )  # fmt: skip
    planned = plan_lucebox(request).plan
    stages = ("warm", "full_chunk", "long", "decode")
    for (_, planned_bytes), card in zip(planned.device_bytes, range(2), strict=False):
        held_mib = run["decode"]["mib"][card]
        assert abs(planned_bytes / MIB - held_mib) / held_mib < 0.05
    peaks_mib = [max(run[stage]["peak_mib"][card] for stage in stages)
                 for card in range(len(planned.device_bytes))]  # fmt: skip
    if placement == "one":
        assert planned.memory_bytes.peak / MIB >= peaks_mib[0]
    assert abs(planned.memory_bytes.peak / MIB - sum(peaks_mib)) / sum(peaks_mib) < 0.05


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_lucebox_serve_on_two_h200s_held_what_the_4cf58a04_plan_says(files, placement):
    """The earlier lease's `lucebox serve --gpus 0,1 --placement P` runs of the 4cf58a04 build
    (benchmarks/results/h200x2-two-gpus-planned-vs-run-both-engines.json, runs apart from the
    fit's): what
    nvidia-smi showed on each card after the warm-up against the plan lucebox makes now."""
    results = (
        Path(__file__).parents[3]
        / "benchmarks/results/h200x2-two-gpus-planned-vs-run-both-engines.json"
    )
    run = json.loads(results.read_text())["lucebox"][placement]
    free = 143156 * MIB
    budget = pool_of(
        tuple(DeviceBudget(i, "NVIDIA H200", 143771 * MIB, free) for i in range(2)), 128 * GIB
    )
    launch = plan_on(files, budget, HELP_4CF58A04, ctx=32768, placement=placement)
    assert launch.refusal is None and launch.to_json()["placement"] == placement
    planned_mib = [b / MIB for _, b in launch.plan.device_bytes]
    held_mib = [m["nvidia_smi_mib"] for m in run["memory"]]
    assert len(planned_mib) == len(held_mib)
    for planned, held in zip(planned_mib, held_mib, strict=True):
        assert abs(planned - held) / held < 0.05


def test_a_plan_before_the_build_reads_the_default_sources_features_as_its_build_will():
    """The table's flag changes carry 62880e20's features forward to the default: before the
    first build, two cards are offered tensor parallel exactly when the build will have it."""
    binary = b"--kvflash DFLASH_SAMPLED_VERIFY"
    will_have = capabilities_of(HELP_4CF58A04, binary, None, symmetric_only=True).features
    assert sorted(luceboxroute.unbuilt_features()) == sorted(will_have)
    assert "target-split-mode" in luceboxroute.unbuilt_features()
    older = capabilities_of(HELP_62880E20, binary, None, symmetric_only=True).features
    assert sorted(luceboxroute.FIRST_SOURCE_FEATURES) == sorted(older)


def test_a_default_that_is_the_oldest_source_takes_no_later_sources_flags():
    sources = lucebox_sources.SOURCES.sources
    assert luceboxroute.features_through(sources, sources[0]) == luceboxroute.FIRST_SOURCE_FEATURES
    assert "target-split-mode" in luceboxroute.features_through(sources, sources[1])
