"""``bench quick``: a fixed prompt set that shows what a configuration does to speed.

The speculation calibration's probes (:mod:`lucebox.engine.run.calibrate.probes`: chat, code, an
edit that repeats its input, an agent turn over tool output), so `--compare spec=on,off` measures
what the calibration measures, and a question over a long document (prefill). At the sampling
the served requests got (`status`'s ``sampling``: greedy when the mix is, else its typical
temperature), with a fixed seed so two runs compare.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from lucebox.engine.bench.compare import ServeConfig, Served
from lucebox.engine.bench.measure import CallSample, streamed_call
from lucebox.engine.engines import kinds
from lucebox.engine.engines.registry import KindName
from lucebox.engine.plan.engineverdict import EngineMeasurement, verdict
from lucebox.engine.plan.speculation.measurements import ProbeRate, TrialRate
from lucebox.engine.run.calibrate.probes import PROBES, Probe
from lucebox.engine.run.front.samplingmix import client_fields

_CITIES = ["Oslo", "Lima", "Pune", "Graz", "Kobe", "Turin", "Perth", "Quito", "Accra", "Hanoi"]
_ITEMS = ["valves", "cables", "pumps", "filters", "sensors", "gaskets", "motors", "relays"]


def _long_document() -> str:
    """A deterministic shipping log of about 2,500 tokens with one fact asked about."""
    lines = []
    for day in range(1, 91):
        city = _CITIES[(day * 7) % len(_CITIES)]
        item = _ITEMS[(day * 3) % len(_ITEMS)]
        crates = (day * 37) % 90 + 10
        lines.append(f"Day {day}: {crates} crates of {item} shipped from the {city} depot.")
    lines[57] = "Day 58: the Kobe depot shipped 412 crates of titanium bolts, the record."
    return "\n".join(lines)


PROMPTS: tuple[Probe, ...] = (
    *PROBES,
    Probe(
        "long",
        (
            {
                "role": "user",
                "content": f"{_long_document()}\n\nIn the log above, which depot shipped the "
                "record number of crates, and of what?",
            },
        ),
        48,
    ),
)
"""The calibration's probes, then a question over a long document (prefill)."""

WARM_UP = ({"role": "user", "content": "Reply with one word."},)


def run_quick(
    served: Served,
    *,
    max_tokens: int | None = None,
    on_sample: Callable[[str, CallSample], None] = lambda name, sample: None,
    prompts: Sequence[Probe] = PROMPTS,
) -> dict[str, CallSample]:
    """One warm-up call (not counted), then each of ``prompts`` once, in order.

    ``max_tokens`` caps every prompt's reply (a smoke run); by default each has its own.
    """
    headers = served.headers()
    base: dict[str, Any] = {**client_fields(served.sampling), **dict(served.config.request_fields)}
    log = served.engine_log
    streamed_call(served.url, {**base, "messages": list(WARM_UP), "max_tokens": 1}, headers)
    samples = {}
    for prompt in prompts:
        limit = prompt.max_tokens if max_tokens is None else min(max_tokens, prompt.max_tokens)
        body = {**base, "messages": list(prompt.messages), "max_tokens": limit}
        sample = streamed_call(served.url, body, headers, engine_log=log)
        samples[prompt.name] = sample
        on_sample(prompt.name, sample)
    return samples


def probes_tok_s(samples: dict[str, CallSample], max_tokens: int | None = None) -> float | None:
    """Decode over the calibration's probes as the calibration counts it: each probe's rate
    weighted by the tokens it asks for (capped by ``max_tokens``)."""
    seconds = weights = 0.0
    for probe in PROBES:
        sample = samples.get(probe.name)
        if sample is None or not sample.decode_tok_s:
            continue
        weight = probe.max_tokens if max_tokens is None else min(max_tokens, probe.max_tokens)
        weights += weight
        seconds += weight / sample.decode_tok_s
    return weights / seconds if seconds > 0 else None


def sample_json(sample: CallSample) -> dict[str, Any]:
    def rounded(value: float | None, digits: int) -> float | None:
        return None if value is None else round(value, digits)

    return {
        "ttft_s": rounded(sample.ttft_s, 3),
        "decode_tok_s": rounded(sample.decode_tok_s, 1),
        "prefill_tok_s": rounded(sample.prefill_tok_s, 1),
        "prompt_tokens": sample.prompt_tokens,
        "completion_tokens": sample.completion_tokens,
        "draft_tokens": sample.draft_tokens,
        "accepted_tokens": sample.accepted_tokens,
        "acceptance": rounded(sample.acceptance, 3),
        "empty": sample.empty,
    }


def probes_trial(
    label: str, samples: dict[str, CallSample], max_tokens: int | None = None
) -> TrialRate:
    """The probes' replies as the calibration keeps them: decode, prompt and prompt reading."""
    rates = []
    for probe in PROBES:
        sample = samples.get(probe.name)
        if sample is None or not sample.decode_tok_s or not sample.completion_tokens:
            continue
        prompt = sample.prompt_tokens or 0
        read_s = prompt / sample.prefill_tok_s if sample.prefill_tok_s else sample.ttft_s
        weight = probe.max_tokens if max_tokens is None else min(max_tokens, probe.max_tokens)
        tokens = sample.completion_tokens
        rates.append(
            ProbeRate(
                probe.name, tokens, tokens / sample.decode_tok_s, 0, 0, weight, prompt, read_s
            )
        )
    return TrialRate(label, None, None, None, tuple(rates), 0.0)


def engines_verdict(
    results: Sequence[tuple[ServeConfig, dict[str, CallSample]]], max_tokens: int | None = None
) -> tuple[KindName, str] | None:
    """The engine calibration's verdict on ``--compare engine=...``'s probes (their own mix);
    None unless both engines were compared."""
    both = EngineMeasurement("bench")
    for config, samples in results:
        if config.engine in kinds.KINDS:
            both = both.with_trial(config.engine, probes_trial(config.name, samples, max_tokens))
    if any(both.trial(kind) is None for kind in kinds.KINDS):
        return None
    kind, why, _ = verdict(both, ())
    return kind, why
