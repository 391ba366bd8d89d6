"""An engine build's self-test on this PC, before ``engine update`` lets it serve anyone.

The current build and the candidate each serve the same model (the one asked for, or the
preset's) through a real ``lucebox serve --engine-id ID``, one after the other; the candidate
must load within the plan's memory, answer the API probes lucebox's clients use (chat,
streaming, Anthropic messages, Responses, a tool call) and decode and prefill at least as fast
as the current build on the calibration's probes, within the noise measured in the same run:
the spread of the current build's rounds (:func:`noise_of`). A candidate that measures slower
is compared once more, against the current build measured again after it (the slower of its
two measurements, within the spread of all its rounds), so a PC whose load rose during the
test does not refuse it. The first probe that fails is named; nothing here switches builds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import psutil

from lucebox.engine.bench.compare import ServeConfig, Served, serving
from lucebox.engine.bench.measure import CallSample, streamed_call
from lucebox.engine.bench.quick import PROMPTS, probes_tok_s, run_quick
from lucebox.engine.core.errors import LuceboxError
from lucebox.engine.core.paths import Paths
from lucebox.engine.pipeline import ServeOptions, prepare
from lucebox.engine.plan.launchplan import PlanRefusal
from lucebox.engine.run.calibrate.probes import PROBES, Probe
from lucebox.engine.run.runstate import current_status

NOISE_FLOOR = 0.05
"""The least noise a self-test allows: two rounds that agree by chance do not make a build 1%
slower a failure."""
NOISE_CAP = 0.25
"""The most noise a self-test allows: on a PC whose rounds swing more, a slower build must
still be told apart. One build registered twice measured 65.3 and 77.3 prefill tok/s one after
the other on a busy 2-core PC (a 16% spread)."""
ROUNDS = 3
"""Rounds of the calibration probes per build; each rate is the best round's (a busy PC only
ever makes a round slower), and the current build's rounds measure the noise."""
MEMORY_SLACK = 1.05
"""The candidate's engine may use this much more than the plan sizes before it is refused."""
PROBE_TOKENS = 64
"""Each calibration probe's reply is capped here for both builds (they stay comparable)."""
SELF_TEST_MIN_CTX = 8192
"""The least context both builds are served with: the long probe is about 2,500 tokens with
real tokenizers and 5,043 with the tests' generated one; a user's smaller context would fail
it with the engine's 400 (seen on the H200 at 4,096)."""
CALL_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class ProbeResult:
    name: str
    passed: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "detail": self.detail}


@dataclass(frozen=True)
class Speed:
    decode_tok_s: float | None
    prefill_tok_s: float | None

    def to_json(self) -> dict[str, float | None]:
        def rounded(value: float | None) -> float | None:
            return None if value is None else round(value, 1)

        return {
            "decode_tok_s": rounded(self.decode_tok_s),
            "prefill_tok_s": rounded(self.prefill_tok_s),
        }


@dataclass(frozen=True)
class SelfTest:
    """What the candidate's self-test found; ``failed`` names the first probe that failed."""

    candidate_id: str
    current_id: str
    probes: tuple[ProbeResult, ...]
    current_speed: Speed | None = None
    candidate_speed: Speed | None = None
    noise: float | None = None
    """The spread of the current build's rounds that the speed verdict allowed."""

    @property
    def failed(self) -> ProbeResult | None:
        return next((p for p in self.probes if not p.passed), None)

    def to_json(self) -> dict[str, Any]:
        failed = self.failed
        return {
            "candidate": self.candidate_id,
            "current": self.current_id,
            "passed": failed is None,
            "failed_probe": failed.name if failed else None,
            "probes": [p.to_json() for p in self.probes],
            "speed": {
                "current": self.current_speed.to_json() if self.current_speed else None,
                "candidate": self.candidate_speed.to_json() if self.candidate_speed else None,
                "noise": None if self.noise is None else round(self.noise, 3),
                "noise_floor": NOISE_FLOOR,
                "noise_cap": NOISE_CAP,
            },
        }


def noise_of(rounds: list[Speed]) -> float:
    """How much one build's rounds spread: the largest (best - slowest) / best of its rates,
    held between :data:`NOISE_FLOOR` and :data:`NOISE_CAP`."""
    spreads = [0.0]
    for values in ([r.decode_tok_s for r in rounds], [r.prefill_tok_s for r in rounds]):
        known = [v for v in values if v is not None]
        if len(known) > 1 and max(known) > 0:
            spreads.append((max(known) - min(known)) / max(known))
    return min(NOISE_CAP, max(NOISE_FLOOR, max(spreads)))


def speed_verdict(current: Speed, candidate: Speed, noise: float) -> ProbeResult:
    """The candidate is as fast as the current build when each rate is within ``noise`` of
    the current one's (a rate neither build reports is not compared)."""
    slower = []
    for what, old, new in (
        ("decode", current.decode_tok_s, candidate.decode_tok_s),
        ("prefill", current.prefill_tok_s, candidate.prefill_tok_s),
    ):
        if old is None:
            continue
        if new is None or new < old * (1 - noise):
            slower.append(f"{what} {new or 0:.1f} tok/s against {old:.1f}")
    if slower:
        return ProbeResult(
            "speed",
            False,
            f"slower than the current build beyond its {noise:.0%} noise: " + "; ".join(slower),
        )
    return ProbeResult(
        "speed", True, f"as fast as the current build (within its {noise:.0%} noise)"
    )


def best_of(rounds: list[Speed]) -> Speed:
    """Each rate's best round (a rate no round reports stays None)."""

    def best(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return max(known) if known else None

    return Speed(best([r.decode_tok_s for r in rounds]), best([r.prefill_tok_s for r in rounds]))


def worst_of(measurements: list[Speed]) -> Speed:
    """Each rate's slowest measurement (a rate none reports stays None)."""

    def worst(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return min(known) if known else None

    return Speed(
        worst([m.decode_tok_s for m in measurements]),
        worst([m.prefill_tok_s for m in measurements]),
    )


def speed_of(samples: dict[str, CallSample]) -> Speed:
    long = samples.get("long")
    return Speed(probes_tok_s(samples, PROBE_TOKENS), long.prefill_tok_s if long else None)


def _post(served: Served, path: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = httpx.post(
        f"{served.url}{path}", json=body, headers=served.headers(), timeout=CALL_TIMEOUT_S
    )
    if reply.status_code != 200:
        raise ValueError(f"{path} answered {reply.status_code}: {reply.text[:200]}")
    data = reply.json()
    if not isinstance(data, dict):
        raise ValueError(f"{path} answered {str(data)[:200]}")
    return data


_ASK = [{"role": "user", "content": "Say hello in one short sentence."}]
_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def _chat(served: Served) -> str:
    data = _post(served, "/v1/chat/completions", {"messages": _ASK, "max_tokens": 16})
    if not isinstance(data["choices"][0]["message"].get("content"), str):
        raise ValueError("the reply has no message content")
    return f"{data['usage']['completion_tokens']} tokens"


def _streaming(served: Served) -> str:
    sample = streamed_call(served.url, {"messages": _ASK, "max_tokens": 16}, served.headers())
    if sample.completion_tokens < 1:
        raise ValueError("the stream carried no tokens")
    return f"{sample.completion_tokens} tokens streamed"


def _anthropic(served: Served) -> str:
    data = _post(
        served, "/v1/messages", {"model": served.model, "messages": _ASK, "max_tokens": 16}
    )
    if data.get("type") != "message" or not isinstance(data.get("content"), list):
        raise ValueError(f"not an Anthropic message: {str(data)[:200]}")
    return f"stop_reason {data.get('stop_reason')}"


def _responses(served: Served) -> str:
    data = _post(
        served,
        "/v1/responses",
        {"model": served.model, "input": _ASK[0]["content"], "max_output_tokens": 16},
    )
    if not isinstance(data.get("output"), list):
        raise ValueError(f"not a Responses reply: {str(data)[:200]}")
    return f"status {data.get('status')}"


def _tool_call(served: Served) -> str:
    """An agent's turn after a tool call: the tools, the call and its result in the history
    (what every agent client sends; a model too small to call tools still answers it)."""
    call: dict[str, Any] = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    messages = [
        {"role": "user", "content": "What is the weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C."},
    ]
    body = {"messages": messages, "tools": [_TOOL], "max_tokens": 16}
    message = _post(served, "/v1/chat/completions", body)["choices"][0]["message"]
    if not (message.get("content") or "").strip() and not message.get("tool_calls"):
        raise ValueError("the reply after the tool's result is empty")
    return "answered after the tool's result"


API_PROBES: tuple[tuple[str, Callable[[Served], str]], ...] = (
    ("chat", _chat),
    ("streaming", _streaming),
    ("anthropic", _anthropic),
    ("responses", _responses),
    ("tool-call", _tool_call),
)


def api_probes(served: Served) -> tuple[ProbeResult, ...]:
    results = []
    for name, probe in API_PROBES:
        try:
            results.append(ProbeResult(name, True, probe(served)))
        except (httpx.HTTPError, LuceboxError, ValueError, KeyError, IndexError, TypeError) as exc:
            results.append(ProbeResult(name, False, str(exc) or type(exc).__name__))
    return tuple(results)


def load_test(
    paths: Paths,
    options: ServeOptions,
    *,
    env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 900,
) -> ProbeResult:
    """The model of ``options`` served by the active build until it answers one chat: what
    ``models update`` asks of a new revision before it switches."""
    try:
        with serving(
            paths, options, ServeConfig("model-update"), env=env, ready_timeout_s=ready_timeout_s
        ) as served:
            return ProbeResult("load", True, f"loaded and answered a chat ({_chat(served)})")
    except LuceboxError as exc:
        return ProbeResult("load", False, exc.message)
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        return ProbeResult("load", False, f"loaded, but the chat failed: {exc}")


def memory_probe(paths: Paths, planned_bytes: int) -> ProbeResult:
    """The serving engine's memory against the plan: the card's used memory on a GPU (the
    run's sample), the engine's resident memory on the CPU."""
    status = current_status(paths)
    used = status.sample.vram_used_bytes if status.sample is not None else None
    if used is None and status.engine_pid is not None:
        try:
            used = psutil.Process(status.engine_pid).memory_info().rss
        except psutil.Error:
            used = None
    if used is None:
        return ProbeResult("memory", False, "the engine's memory could not be read")
    detail = f"{used / 2**20:.0f} MiB used, {planned_bytes / 2**20:.0f} MiB planned"
    return ProbeResult("memory", used <= planned_bytes * MEMORY_SLACK, detail)


def self_test_launch(
    paths: Paths, options: ServeOptions, on_note: Callable[[str], None]
) -> tuple[ServeOptions, tuple[Probe, ...]]:
    """The options both builds serve with and the prompts they are measured on: a context the
    user set below :data:`SELF_TEST_MIN_CTX` is raised to it where that fits; where it does not,
    the user's context stays and the long prompt is left out (prefill is then not compared)."""
    if options.ctx is None or options.ctx >= SELF_TEST_MIN_CTX:
        return options, PROMPTS
    raised = dataclasses.replace(options, ctx=SELF_TEST_MIN_CTX)
    try:
        prepare(paths, raised, lambda e: None, dry_run=True)
    except PlanRefusal:
        on_note(
            f"self-testing at the {options.ctx}-token context asked for, without the long "
            f"prompt: a {SELF_TEST_MIN_CTX}-token context does not fit here, so prefill is not "
            "compared"
        )
        return options, PROBES
    on_note(f"self-testing at a {SELF_TEST_MIN_CTX}-token context (its long probe's need)")
    return raised, PROMPTS


def run_self_test(
    paths: Paths,
    options: ServeOptions,
    current_id: str,
    candidate_id: str,
    *,
    env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 900,
    on_note: Callable[[str], None] = lambda note: None,
) -> SelfTest:
    """Serve ``current_id`` then ``candidate_id`` and probe both as the module says."""
    options, prompts = self_test_launch(paths, options, on_note)

    def config(engine_id: str) -> ServeConfig:
        # No prompt reuse: a second round must read its prompts again to measure prefill.
        no_reuse = (("cache_prompt", False),)
        return ServeConfig(engine_id, ("--engine-id", engine_id), request_fields=no_reuse)

    def rounds(served: Served) -> list[Speed]:
        return [
            speed_of(run_quick(served, max_tokens=PROBE_TOKENS, prompts=prompts))
            for _ in range(ROUNDS)
        ]

    on_note(f"measuring the current build {current_id}")
    with serving(
        paths, options, config(current_id), env=env, ready_timeout_s=ready_timeout_s
    ) as on:
        current_rounds = rounds(on)
    current, noise = best_of(current_rounds), noise_of(current_rounds)
    probes: list[ProbeResult] = []
    on_note(f"self-testing {candidate_id}")
    try:
        planned = prepare(
            paths,
            dataclasses.replace(options, engine_id=candidate_id),
            lambda e: None,
            dry_run=True,
        ).launch.server.plan.memory_bytes.total
        with serving(
            paths, options, config(candidate_id), env=env, ready_timeout_s=ready_timeout_s
        ) as served:
            probes.append(ProbeResult("load", True, f"ready at {served.url}"))
            probes.extend(api_probes(served))
            candidate = best_of(rounds(served))
            probes.append(memory_probe(paths, planned))
    except LuceboxError as exc:  # before ready: the load; after: a probe call broke off
        probes.append(ProbeResult("speed" if probes else "load", False, exc.message))
        return SelfTest(candidate_id, current_id, tuple(probes), current, noise=noise)
    verdict = speed_verdict(current, candidate, noise)
    if not verdict.passed:
        # The PC's load may have changed between the two: the current build once more, after
        # the candidate, and the candidate against its slower measurement, within the spread
        # of all its rounds.
        on_note(f"measuring {current_id} again: {verdict.detail}")
        with serving(
            paths, options, config(current_id), env=env, ready_timeout_s=ready_timeout_s
        ) as again:
            again_rounds = rounds(again)
        current = worst_of([current, best_of(again_rounds)])
        noise = noise_of(current_rounds + again_rounds)
        verdict = speed_verdict(current, candidate, noise)
    probes.append(verdict)
    return SelfTest(candidate_id, current_id, tuple(probes), current, candidate, noise)
