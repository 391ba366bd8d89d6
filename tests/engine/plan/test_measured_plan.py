"""The planner reads the measurement store: a measured verdict decides auto's speculation for
the same file, build, card, context and KV type, and says so; a forced mode is not overridden."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.machine import gpu
from lucebox.engine.machine.budget import budget_for
from lucebox.engine.machine.config import Settings
from lucebox.engine.plan import planner
from lucebox.engine.plan.launchplan import LaunchPlan
from lucebox.engine.plan.options import ServeOptions, resolve
from lucebox.engine.plan.planner import installs_of
from lucebox.engine.plan.speculation.measurements import (
    OFF,
    Measurement,
    ProbeRate,
    TrialRate,
    write_measurement,
)
from lucebox.engine.plan.speculation.speculation import SpecMode
from support.ggufgen import cached_gguf, qwen35_target, widen
from tests.conftest import run_lucebox


def launch_of(target: Path, spec: SpecMode | None = None, vram_mib: int = 16384) -> LaunchPlan:
    paths = resolve_paths()
    wanted = ServeOptions(model=str(target), vram_mib=(vram_mib,), spec=spec)
    return planner.plan_launch(
        paths,
        wanted,
        resolved=resolve(wanted, Settings()),
        budget=budget_for(gpu.probe_gpus(), (), (vram_mib,)),
        installs=installs_of(),
    )


def rate(label: str, spec_type: str | None, tok_s: float, p_min: float | None = None) -> TrialRate:
    draft_max = 3 if spec_type else None
    return TrialRate(
        label, spec_type, draft_max, p_min, (ProbeRate("edit", 100, 100 / tok_s),), 1.0
    )


def test_a_measured_off_verdict_turns_auto_off_with_the_reason():
    target = cached_gguf(qwen35_target())
    launch = launch_of(target)
    key = launch.speculation.measurement_key
    assert key is not None and key.card == "a 16384 MiB card" and key.ctx == launch.plan.ctx
    assert [c.spec_type for c in launch.speculation.candidates] == [
        "draft-mtp",
        "ngram-mod",
        "ngram-mod,draft-mtp",
    ]
    assert launch.speculation.spec_type == "draft-mtp"  # nothing measured yet: the prior
    why = "measured on this card over 1 probes, none is faster: draft-mtp n3 p0.75 0.65x"
    trials = (rate(OFF, None, 680), rate("draft-mtp n3 p0.75", "draft-mtp", 440, 0.75))
    write_measurement(resolve_paths(), Measurement(key, trials, OFF, why))
    measured = launch_of(target)
    assert measured.speculation.spec_type is None
    assert measured.speculation.reason.startswith(f"off: {why}")
    # The CLI plans through the same store.
    document = json.loads(run_lucebox("plan", "--model", str(target), "--vram-mib", "16384",
                                      "--json").stdout)  # fmt: skip
    assert document["spec"]["type"] is None and "none is faster" in document["reasons"]["spec"]
    # A mode the user forces is theirs, whatever was measured.
    assert launch_of(target, spec="mtp").speculation.spec_type == "draft-mtp"


def test_a_measured_winner_is_served_with_the_measured_p_min():
    target = cached_gguf(qwen35_target())
    key = launch_of(target).speculation.measurement_key
    assert key is not None
    trials = (rate(OFF, None, 680), rate("draft-mtp n3 p0", "draft-mtp", 900, 0.0))
    write_measurement(resolve_paths(), Measurement(key, trials, "draft-mtp n3 p0", "1.32x"))
    launch = launch_of(target)
    assert launch.server.spec_type == "draft-mtp" and launch.server.draft_p_min == 0.0
    assert "--spec-draft-p-min" in launch.argv
    assert launch.argv[launch.argv.index("--spec-draft-p-min") + 1] == "0"
    assert "1.32x" in launch.speculation.reason
    assert "served as draft-mtp n3 p0: 1.32x" in launch.speculation.reason
    assert "then stops speculating, if decoding falls 15% below the rate measured" in (
        launch.speculation.reason
    )


def test_a_head_whose_memory_costs_context_is_not_measured_under_auto(tmp_path):
    # A 1.7 GB target (header only) on a 3000 MiB card: the head's KV would cost context.
    shape = qwen35_target(n_layer=16, vocab_size=32000, n_ctx=262144, header_only=True)
    target = cached_gguf(widen(shape, 32), tmp_path)
    squeezed = launch_of(target, vram_mib=3000)
    assert "not draft-mtp: its memory would leave" in squeezed.speculation.reason
    assert [c.spec_type for c in squeezed.speculation.candidates] == ["ngram-mod"]
    roomy = launch_of(target, vram_mib=5000)
    assert [c.spec_type for c in roomy.speculation.candidates] == [
        "draft-mtp",
        "ngram-mod",
        "ngram-mod,draft-mtp",
    ]
    forced = launch_of(target, spec="mtp", vram_mib=3000)  # the user's choice is measured
    assert [c.spec_type for c in forced.speculation.candidates] == ["draft-mtp"]


def test_a_guard_switch_off_is_written_back_so_a_restart_keeps_speculation_off():
    from lucebox.engine.pipeline import Prepared
    from lucebox.engine.plan.speculation.specguard import Decision
    from lucebox.engine.runstart import Replanner

    target = cached_gguf(qwen35_target())
    launch = launch_of(target)
    assert launch.server.spec_type == "draft-mtp"
    replanner = Replanner(resolve_paths(), Prepared(launch, Settings(), 0, 60.0))
    seen = "drafted nothing in 600 decoded tokens, 0.61x of none"
    decision = Decision("off", 0.0, None, f"{seen}; speculation switched off", seen)
    changed = replanner.after_spec_decision(decision, launch.server)
    assert changed is not None and changed.spec_type is None
    restarted = launch_of(target)  # a new `lucebox serve` plans from the store
    assert restarted.speculation.spec_type is None
    assert restarted.speculation.reason.startswith(
        f"off: switched off by the guard while serving: {seen}"
    )
    # A mode the user forces is still theirs.
    assert launch_of(target, spec="mtp").speculation.spec_type == "draft-mtp"


def test_every_re_plan_of_a_run_reads_the_verdicts_at_the_clients_sampling():
    """After the engine calibration the launch is planned again on the chosen engine: it must
    read the speculation verdict stored for the sampling clients sent (greedy here), not the
    model's defaults', or the measured mode is lost and the prior serves."""
    from types import SimpleNamespace

    from lucebox.engine.pipeline import Prepared
    from lucebox.engine.plan.samplingdefaults import GREEDY
    from lucebox.engine.run.front.samplingmix import SamplingMix
    from lucebox.engine.runstart import Replanner

    target = cached_gguf(qwen35_target())
    launch = launch_of(target)
    key = launch.speculation.measurement_key
    assert key is not None and key.sampling != GREEDY
    why = "measured on this card over 1 probes, none is faster: draft-mtp n3 p0.75 0.65x"
    trials = (rate(OFF, None, 680), rate("draft-mtp n3 p0.75", "draft-mtp", 440, 0.75))
    write_measurement(resolve_paths(), Measurement(replace(key, sampling=GREEDY), trials, OFF, why))
    replanner = Replanner(resolve_paths(), Prepared(launch, Settings(), 0, 60.0))
    unmeasured = replanner.for_engine(None)
    assert unmeasured is not None and unmeasured[0].spec_type == "draft-mtp"
    mix = SamplingMix()
    mix.record(b'{"temperature": 0}')
    replanner.run = SimpleNamespace(front=SimpleNamespace(sampling=mix))
    measured = replanner.for_engine(None)
    assert measured is not None and measured[0].spec_type is None
    assert measured[1].startswith(f"off: {why}")
