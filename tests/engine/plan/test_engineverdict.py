"""The engines' verdict on recorded numbers: the H100 pair of issue 39 (the Lucebox engine
decoding 1.46x faster but reading prompts up to 30x slower) under an agent mix and a
decode-heavy one, the tie margin, the rule as the prior, and the store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.plan import engineverdict
from lucebox.engine.plan.enginechoice import EngineFacts, choose_engine
from lucebox.engine.plan.engineverdict import ENGINE_TIE_MARGIN, EngineMeasurement, verdict
from lucebox.engine.plan.speculation.measurements import ProbeRate, TrialRate, store_file
from lucebox.engine.plan.speculation.workload import ServedRequest

# (name, prompt tokens, reply tokens) of the probe set as a 2K-context launch measured it.
SHAPES = (("chat", 40, 96), ("code", 50, 192), ("edit", 330, 320), ("agent", 420, 160))


def engine_rate(label: str, decode_tok_s: float, prefill_tok_s: float) -> TrialRate:
    probes = tuple(
        ProbeRate(name, reply, reply / decode_tok_s, 0, 0, reply, prompt, prompt / prefill_tok_s)
        for name, prompt, reply in SHAPES
    )
    return TrialRate(label, None, None, None, probes, 5.0)


# H100, issue 39: DDTree 1.46x llama-server's decode; prefill 2.5x-30x slower (10x here).
LLAMA = engine_rate("llama-server ngram-mod", 300.0, 8000.0)
LUCE = engine_rate("lucebox ddtree", 438.0, 800.0)
BOTH = EngineMeasurement("k").with_trial("llama-server", LLAMA).with_trial("lucebox", LUCE)
AGENT = [ServedRequest(420, 20, 0.1)] * 16  # long prompts, short replies
DECODE = [ServedRequest(40, 800, 2.0)] * 16  # short prompts, long replies


def test_an_agent_mix_is_served_by_llama_server_and_a_decode_heavy_one_by_lucebox():
    kind, why, costs = verdict(BOTH, AGENT)
    assert kind == "llama-server"
    assert why.startswith("llama-server is faster, measured on this card over the served mix")
    assert costs[0].request_s < costs[1].request_s
    assert costs[1].ttft_s > 5 * costs[0].ttft_s
    kind, why, costs = verdict(BOTH, DECODE)
    assert kind == "lucebox" and why.startswith("the Lucebox engine is faster")
    assert costs[1].decode_tok_s / costs[0].decode_tok_s == pytest.approx(438 / 300)


def test_without_served_requests_the_probes_own_mix_decides():
    # The probes ask 768 reply tokens after 840 prompt tokens: with prefill 10x slower the
    # Lucebox engine loses them, with prefill 2.5x slower its decode wins.
    kind, why, _ = verdict(BOTH, ())
    assert "over the probes' own mix" in why and kind == "llama-server"
    faster_read = BOTH.with_trial("lucebox", engine_rate("lucebox ddtree", 438.0, 3200.0))
    assert verdict(faster_read, ())[0] == "lucebox"


def test_a_near_tie_goes_to_llama_server():
    slightly = engine_rate("lucebox ddtree", 300.0 / (1 - ENGINE_TIE_MARGIN / 2), 8000.0)
    tied = BOTH.with_trial("lucebox", slightly)
    kind, why, costs = verdict(tied, DECODE)
    assert costs[1].request_s < costs[0].request_s
    assert kind == "llama-server" and why.startswith("llama-server: within the 5% tie margin")


def test_a_close_verdict_runs_again_and_a_switch_needs_to_clear_the_runs_spread():
    # One run each, 8% apart: closer than a single run can tell, so both run again.
    luce = engine_rate("lucebox ddtree", 300.0 / 0.92, 8000.0)
    one = BOTH.with_trial("lucebox", luce)
    assert engineverdict.needs_another_run(verdict(one, DECODE)[2])
    # Far apart after one run: the verdict stands.
    assert not engineverdict.needs_another_run(verdict(BOTH, DECODE)[2])
    # Second runs: llama-server's wider apart than the gap (315 then 285 tok/s).
    llama = engine_rate("l", 315.0, 8000.0).with_run(engine_rate("l", 285.0, 8000.0))
    luce2 = luce.with_run(engine_rate("lucebox ddtree", 300.0 / 0.92, 8000.0))
    two = one.with_trial("llama-server", llama).with_trial("lucebox", luce2)
    kind, why, costs = verdict(two, DECODE)
    assert costs[0].runs == 2 and costs[0].spread == pytest.approx(0.10, abs=0.01)
    assert costs[1].spread == 0.0 and costs[1].request_s < costs[0].request_s
    assert kind == "llama-server" and "within the 10% runs' spread" in why
    assert "±5% over 2 runs" in why
    assert engineverdict.needs_another_run(costs)
    # A third run each: no more, whatever the gap.
    three = two.with_trial("llama-server", llama.with_run(engine_rate("l", 300.0, 8000.0)))
    three = three.with_trial("lucebox", luce2.with_run(luce))
    assert not engineverdict.needs_another_run(verdict(three, DECODE)[2])


def test_a_run_of_another_mode_starts_the_runs_afresh():
    # The speculation verdict changed between two runs of one engine: its draft, then none.
    drafted = engine_rate("llama-server draft-simple n8", 214.0, 8000.0)
    plain = engine_rate("llama-server off", 711.0, 8000.0)
    assert drafted.with_run(plain) == plain and plain.runs() == (plain.probes,)
    again = plain.with_run(engine_rate("llama-server off", 690.0, 8000.0))
    assert len(again.runs()) == 2 and again.configuration() == plain.configuration()


def test_runs_are_kept_in_the_store_and_verdicts_by_sampling(tmp_path: Path):
    trial = LLAMA.with_run(engine_rate("llama-server ngram-mod", 270.0, 8000.0))
    assert TrialRate.from_json(json.loads(json.dumps(trial.to_json()))) == trial
    assert TrialRate.from_json(LLAMA.to_json()) == LLAMA
    base = "m.gguf | - | H100 | 4096"
    assert engineverdict.at_sampling(base, "greedy") == base
    sampled = engineverdict.at_sampling(base, "t0.7")
    assert sampled == f"{base} | t0.7" and engineverdict.at_sampling(sampled, "t0.6").endswith(
        "| 4096 | t0.6"
    )
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path)})
    engineverdict.write_engines(paths, EngineMeasurement(sampled, chosen="lucebox"))
    assert engineverdict.read_engines(paths, base) is None
    found = engineverdict.read_engines(paths, sampled)
    assert found is not None and found.chosen == "lucebox"


def facts(**changed) -> EngineFacts:
    base = {
        "mode": "auto",
        "mode_from": "",
        "target_arch": "qwen35",
        "target_has_mtp": False,
        "on_nvidia_gpu": True,
        "draft_name": "d.gguf",
        "draft_arch": "qwen35-dflash-draft",
    }
    return EngineFacts(**{**base, **changed})


def test_the_rule_is_the_prior_and_a_verdict_replaces_it_where_both_engines_serve():
    prior = choose_engine(facts())
    assert prior.kind == "lucebox" and prior.both and not prior.measured
    assert prior.reason.endswith("(the rule, before a measurement on this card)")
    assert prior.unmeasured == "both engines are measured on this card once the server is idle"
    measured = choose_engine(facts(measured=("llama-server", "llama-server is faster, ...")))
    assert measured.kind == "llama-server" and measured.measured
    assert measured.to_json()["measured"] is True and measured.to_json()["unmeasured"] is None
    # A forced engine is kept (and measured); a CPU or a non-Lucebox launch is the rule alone.
    forced = choose_engine(facts(mode="llama-server", measured=("lucebox", "faster")))
    assert forced.kind == "llama-server" and forced.both and "forced" in forced.unmeasured
    assert not choose_engine(facts(on_nvidia_gpu=False)).both
    plain = choose_engine(facts(draft_name=None, draft_arch=None))
    assert plain.kind == "llama-server" and not plain.both
    long_ctx = choose_engine(facts(draft_name=None, draft_arch=None, ctx_asked=65536))
    assert long_ctx.both and long_ctx.kind == "llama-server"


def test_a_missing_build_is_never_measured_and_the_plan_says_what_building_it_buys():
    missing = choose_engine(facts(missing_build="lucebox", measured=("llama-server", "x")))
    assert missing.kind == "lucebox" and not missing.measured  # the rule: it builds as before
    assert missing.missing_build == "lucebox"
    assert missing.unmeasured.startswith(
        "the Lucebox engine is not built, so the engines are not compared on this card: "
        "`lucebox engine build --engine lucebox` would let lucebox measure both"
    )


def test_the_verdict_is_kept_in_the_engines_section_beside_the_speculation_entries(
    lucebox_home: Path,
):
    paths = resolve_paths({"LUCEBOX_HOME": str(lucebox_home)})
    kind, why, _ = verdict(BOTH, AGENT)
    done = EngineMeasurement(BOTH.key, BOTH.trials, kind, why, (("agent", 1.0),), 0.0)
    engineverdict.write_engines(paths, done)
    assert engineverdict.read_engines(paths, "k") == done
    assert engineverdict.read_engines(paths, "other") is None
    document = json.loads(store_file(paths).read_text())
    assert document["version"] == 2 and document["engines"]["k"]["chosen"] == "llama-server"
    assert done.unmeasured() == ()
    due = EngineMeasurement("k", BOTH.trials, remeasure_at=6.0)
    assert due.unmeasured() == ("llama-server", "lucebox")
