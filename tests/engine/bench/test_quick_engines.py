"""`bench quick --compare engine=...` judges the engines as the calibration does: the same
probes, each reply's decode and prompt reading, the same verdict and tie margin."""

from __future__ import annotations

from lucebox.engine.bench.compare import ServeConfig
from lucebox.engine.bench.measure import CallSample
from lucebox.engine.bench.quick import engines_verdict, probes_trial
from lucebox.engine.plan.engineverdict import EngineMeasurement, verdict
from lucebox.engine.run.calibrate.probes import PROBES

PROMPTS = {"chat": 40, "code": 50, "edit": 330, "rewrite": 2100, "agent": 420}


def samples(decode_tok_s: float, prefill_tok_s: float) -> dict[str, CallSample]:
    found = {}
    for probe in PROBES:
        prompt = PROMPTS[probe.name]
        found[probe.name] = CallSample(
            ttft_s=prompt / prefill_tok_s + 0.01, decode_tok_s=decode_tok_s,
            prefill_tok_s=prefill_tok_s, prompt_tokens=prompt, cached_tokens=0,
            completion_tokens=probe.max_tokens, draft_tokens=None, accepted_tokens=None,
            text="x", tool_calls=0, wall_s=1.0,
        )  # fmt: skip
    return found


def compared(lucebox_prefill_tok_s: float) -> list[tuple[ServeConfig, dict[str, CallSample]]]:
    return [
        (ServeConfig("engine=llama-server", engine="llama-server"), samples(300.0, 8000.0)),
        (ServeConfig("engine=lucebox", engine="lucebox"), samples(438.0, lucebox_prefill_tok_s)),
    ]


def test_the_comparison_gives_the_calibrations_verdict_on_the_same_probes():
    for prefill, expected in ((800.0, "llama-server"), (3200.0, "lucebox")):
        results = compared(prefill)
        found = engines_verdict(results)
        assert found is not None and found[0] == expected
        both = EngineMeasurement("k")
        for config, by_probe in results:
            assert config.engine in ("llama-server", "lucebox")
            both = both.with_trial(config.engine, probes_trial(config.name, by_probe))
        assert verdict(both, ())[:2] == found
        trial = both.trial("lucebox")
        assert trial is not None and [p.name for p in trial.probes] == [p.name for p in PROBES]
        assert trial.probes[-1].prefill_s == 420 / prefill


def test_no_verdict_unless_both_engines_were_compared():
    spec = [(ServeConfig("spec=on"), samples(300.0, 8000.0))]
    assert engines_verdict(spec) is None
