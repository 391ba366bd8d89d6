"""N-gram lookup in front of the model's draft (issue 56): a candidate only where the engine has
ngram-mod and a draft or MTP head is planned, after the single modes; its flags, its guard, its
name, and a calibration trial that plans exactly it."""

from __future__ import annotations

from pathlib import Path

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.machine import gpu
from lucebox.engine.machine.budget import budget_for
from lucebox.engine.machine.config import Settings
from lucebox.engine.plan import planner
from lucebox.engine.plan.launch import server_argv
from lucebox.engine.plan.launchplan import LaunchPlan
from lucebox.engine.plan.options import ServeOptions, resolve
from lucebox.engine.plan.planner import installs_of
from lucebox.engine.plan.speculation import specguard, speculation
from lucebox.engine.plan.speculation.measurements import (
    OFF,
    Measurement,
    ProbeRate,
    TrialRate,
    write_measurement,
)
from lucebox.engine.plan.speculation.speculation import SpecFiles
from lucebox.engine.plan.speculation.workload import RateCurve, ServedRequest
from lucebox.engine.run.sample import SpecStatus
from support.ggufgen import cached_gguf, qwen35_target

LLAMA_TYPES = ("draft-simple", "draft-mtp", "draft-dflash", "ngram-mod", "ngram-simple")
MTP_TARGET = SpecFiles("t.gguf", target_has_mtp=True, target_is_moe=False)
WITH_DRAFT = SpecFiles(
    "t.gguf", False, False, draft_name="d.gguf", draft_type="draft-simple"
)  # fmt: skip


def types(found: list[speculation.SpecCandidate]) -> list[str]:
    return [c.spec_type for c in found]


def test_the_combination_comes_after_the_single_modes_with_the_drafts_settings():
    found = speculation.candidates(MTP_TARGET, LLAMA_TYPES)
    assert types(found) == ["draft-mtp", "ngram-mod", "ngram-mod,draft-mtp"]
    both = found[-1]
    assert (both.uses_draft_file, both.draft_max, both.p_min) == (False, 3, 0.75)
    assert both.why.startswith("n-gram lookup first, where the reply repeats the prompt, then")
    found = speculation.candidates(WITH_DRAFT, LLAMA_TYPES)
    assert types(found) == ["draft-simple", "ngram-mod", "ngram-mod,draft-simple"]
    assert found[-1].uses_draft_file and found[-1].draft_max == 8


def test_no_combination_without_a_model_draft_or_without_ngram_in_the_engine():
    plain = SpecFiles("t.gguf", False, False)
    assert types(speculation.candidates(plain, LLAMA_TYPES)) == ["ngram-mod"]
    no_ngram = tuple(t for t in LLAMA_TYPES if not t.startswith("ngram"))
    assert types(speculation.candidates(MTP_TARGET, no_ngram)) == ["draft-mtp"]
    # The Lucebox engine's types: DFlash and DDTree, no prompt lookup to combine.
    assert speculation.candidates(MTP_TARGET, ("dflash", "ddtree")) == []


def test_the_parts_and_the_mode_of_a_combination():
    assert speculation.type_parts("ngram-mod,draft-mtp") == ("ngram-mod", "draft-mtp")
    assert speculation.model_type("ngram-mod,draft-mtp") == "draft-mtp"
    assert speculation.model_type("ngram-mod") == "ngram-mod"
    assert speculation.mode_of("ngram-mod,draft-simple") == "draft"
    assert speculation.mode_of("ngram-mod") == "ngram"
    assert speculation.drafts_from_text_only("ngram-mod")
    assert not speculation.drafts_from_text_only("ngram-mod,draft-mtp")


def test_on_a_cpu_the_combination_goes_with_its_draft_unless_the_user_named_it():
    kept, why = speculation.for_backend(speculation.candidates(MTP_TARGET, LLAMA_TYPES), False)
    assert types(kept) == ["ngram-mod"]
    assert why.startswith("not draft-mtp: on a CPU")  # the draft is named, once
    found = speculation.candidates(WITH_DRAFT, LLAMA_TYPES)
    kept, _ = speculation.for_backend(found, False, user_draft=True)
    assert types(kept) == types(found)


def test_a_mode_the_user_forces_serves_its_own_type_alone():
    found = speculation.candidates(MTP_TARGET, LLAMA_TYPES)
    assert types(speculation.for_mode(found, "mtp")) == ["draft-mtp"]
    assert types(speculation.for_mode(found, "ngram")) == ["ngram-mod"]
    assert types(speculation.for_mode(found, "auto")) == types(found)


def test_the_guard_judges_a_combination_by_its_model_draft():
    assert specguard.acceptance_floor("ngram-mod,draft-mtp", 3, True)[0] == 0.6
    assert specguard.acceptance_floor("ngram-mod,draft-mtp", 3, False)[0] == 1.0
    # A model behind the n-gram table that drafts nothing is switched off, as the model alone.
    curve = RateCurve(((100, 50.0),), 50.0)
    guard = specguard.SpecGuard.for_launch("ngram-mod,draft-mtp", 3, True, baseline=curve)
    requests = [ServedRequest(100, 600, 10.0)]
    _, decision = guard.judge_rate(requests, 0)
    assert decision is not None and decision.action == "off"
    ngram = specguard.SpecGuard.for_launch("ngram-mod", None, True, baseline=curve)
    assert ngram.judge_rate(requests, 0)[1] is None


def test_status_names_a_combination_by_both_modes():
    assert SpecStatus("ngram-mod,draft-mtp", True, "", None, None).mode_name == "n-gram + MTP"
    assert SpecStatus("ngram-mod,draft-simple", True, "", None, None).mode_name == (
        "n-gram + draft model"
    )
    assert SpecStatus("ngram-mod", True, "", None, None).mode_name == "n-gram"


def launch_of(target: Path) -> LaunchPlan:
    wanted = ServeOptions(model=str(target), vram_mib=(16384,))
    return planner.plan_launch(
        resolve_paths(),
        wanted,
        resolved=resolve(wanted, Settings()),
        budget=budget_for(gpu.probe_gpus(), (), (16384,)),
        installs=installs_of(),
    )


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_a_trial_plans_the_combination_and_a_verdict_for_it_serves_it():
    target = cached_gguf(qwen35_target())
    launch = launch_of(target)
    assert launch.speculation.spec_type == "draft-mtp"  # unmeasured: the single mode first
    trial = planner.replan(
        resolve_paths(), launch, Settings(), spec="mtp", spec_type="ngram-mod,draft-mtp"
    )
    server = trial.server
    assert (server.spec_type, server.draft_max, server.draft_p_min) == (
        "ngram-mod,draft-mtp",
        3,
        0.75,
    )
    argv = server_argv(server)
    assert flag(argv, "--spec-type") == "ngram-mod,draft-mtp" and "-md" not in argv
    assert flag(argv, "--spec-draft-n-max") == "3" and flag(argv, "--spec-draft-p-min") == "0.75"
    assert argv.count("--spec-type") == 1
    key = launch.speculation.measurement_key
    assert key is not None
    label = "ngram-mod,draft-mtp n3 p0.75"
    probe = (ProbeRate("rewrite", 100, 0.1),)
    trials = (
        TrialRate(OFF, None, None, None, (ProbeRate("rewrite", 100, 0.5),), 1.0),
        TrialRate(label, "ngram-mod,draft-mtp", 3, 0.75, probe, 1.0),
    )
    write_measurement(resolve_paths(), Measurement(key, trials, label, "measured"))
    measured = launch_of(target)
    assert measured.speculation.spec_type == "ngram-mod,draft-mtp"
    assert measured.speculation.to_json()["type"] == "ngram-mod,draft-mtp"
    assert "served as ngram-mod,draft-mtp n3 p0.75: measured" in measured.speculation.reason
