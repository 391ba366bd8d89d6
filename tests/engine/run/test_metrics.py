"""The sampler fed what the pinned engine really wrote (tests/engine/enginelog, recorded by its
capture.py from the built CPU engine serving SmolLM2 and Gemma 3): its log lines, /metrics and
/slots bodies, checked against the `timings` the engine put in each reply."""

from __future__ import annotations

import os

import httpx
import pytest

from lucebox.engine.run.kinds.enginelog import EngineLog
from lucebox.engine.run.kinds.metrics import (
    RateWindow,
    Sampler,
    WindowRates,
    parse_counters,
    with_last_rates,
)
from lucebox.engine.run.sample import Sample
from tests.engine.enginelog import engine_lines, http_seen
from tests.engine.fake_nvml import FakeGpu, FakeNvml


def per_request(lines: list[str]) -> list[list[str]]:
    """The log cut after each request's last line (`stop processing`)."""
    chunks: list[list[str]] = [[]]
    for line in lines:
        chunks[-1].append(line)
        if "stop processing" in line:
            chunks.append([])
    return chunks


def decode_rate(timings: dict) -> float:
    """The engine's own rule: decode steps (the first token is free) over decode time."""
    return (timings["predicted_n"] - 1) / (timings["predicted_ms"] / 1000)


def test_parse_counters_keeps_unlabelled_series_only():
    counters = parse_counters(http_seen("spec")["metrics"][-1])
    assert counters["spec_decode_num_draft_tokens_total"] > 0
    assert "spec_decode_num_accepted_tokens_per_pos_total" not in counters


class Engine:
    """Serves recorded /metrics and /slots bodies; the test moves it from one to the next."""

    def __init__(self, metrics: str, slots: list) -> None:
        self.metrics, self.slots = metrics, slots
        self.asked: list[str] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.asked.append(request.url.path)
        if request.url.path == "/metrics":
            return httpx.Response(200, text=self.metrics)
        return httpx.Response(200, json=self.slots)


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


async def test_sampler_replays_a_speculative_run_as_the_engine_timed_it():
    seen, chunks = http_seen("spec"), per_request(engine_lines("spec"))
    timings = seen["timings"]
    engine, clock, log = Engine(seen["metrics"][0], seen["slots_idle"]), Clock(), EngineLog()
    gpu = FakeGpu(processes=[(os.getpid(), 3 * 2**30)])
    sampler = Sampler(
        "http://engine",
        os.getpid(),
        log,
        nvml=FakeNvml(gpus=[gpu]),
        spec_type="draft-simple",
        clock=clock,
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(engine.handler)) as client:
        loaded = next(i for i, line in enumerate(chunks[0]) if "listening on" in line)
        for line in chunks[0][: loaded + 1]:
            log.feed(line)  # the load, up to the first request
        first = await sampler.sample_once(client)
        assert first is not None
        assert (first.decode_tokens_per_s, first.requests_finished) == (None, 0)
        assert (first.slots_busy, first.slots_total) == (0, 2)
        assert first.vram_used_bytes == 3 * 2**30
        # Three short requests, each longer than the window: each sample shows that request.
        for index in range(3):
            for line in chunks[index]:
                log.feed(line)
            engine.metrics = seen["metrics"][index + 1]
            clock.now_s += 30
            sample = await sampler.sample_once(client)
            replied = timings[index]
            assert sample is not None and sample.requests_finished == 1
            assert sample.requests_finished_total == index + 1
            assert sample.decode_tokens_per_s == pytest.approx(decode_rate(replied), rel=1e-4)
            assert sample.last_decode_tokens_per_s == sample.decode_tokens_per_s
            assert sample.prefill_tokens_per_s == pytest.approx(
                replied["prompt_per_second"], rel=1e-3
            )
            assert sample.ttft_s == pytest.approx(replied["prompt_ms"] / 1000, abs=1e-5)
            assert sample.spec_acceptance == pytest.approx(
                replied["draft_n_accepted"] / replied["draft_n"]
            )
            cache = sampler.cache_status()
            assert cache.last_cached_tokens == replied["cache_n"]
            assert cache.cached_prompt_share == pytest.approx(
                replied["cache_n"] / (replied["cache_n"] + replied["prompt_n"])
            )
        # A long request: its progress shows while it runs, from /slots, at the real pace.
        long_request, live = timings[3], seen["live"]
        start_s = clock.now_s
        running = []
        for poll in live:
            engine.metrics, engine.slots = poll["metrics"], poll["slots"]
            clock.now_s = start_s + poll["at_s"] - live[0]["at_s"]
            sample = await sampler.sample_once(client)
            assert sample is not None and sample.requests_finished == 0
            if sample.slots_busy:
                running.append(sample)
        # Once the window holds only its progress, the rate is the long request's own pace.
        assert len(running) > 20
        assert running[-1].decode_tokens_per_s == pytest.approx(decode_rate(long_request), rel=0.25)
        for line in chunks[3]:
            log.feed(line)
        engine.metrics = seen["metrics"][-1]
        engine.slots = seen["slots_idle"]
        clock.now_s += 1
        done = await sampler.sample_once(client)
    # Once finished, the engine's timing lines replace the progress: exact again.
    assert done is not None and done.requests_finished == 1 and done.slots_busy == 0
    assert done.decode_tokens_per_s == pytest.approx(decode_rate(long_request), rel=1e-4)
    assert done.requests_finished_total == len(timings)
    assert done.decode_tokens_total == sum(t["predicted_n"] - 1 for t in timings)
    assert done.decode_seconds_total == pytest.approx(
        sum(t["predicted_ms"] for t in timings) / 1000, abs=1e-4
    )
    assert done.prefill_tokens_total == sum(t["prompt_n"] for t in timings)
    counters = parse_counters(seen["metrics"][-1])
    assert done.generated_tokens_total == sum(t["predicted_n"] for t in timings)
    assert done.cached_prompt_tokens_total == counters["prompt_tokens_cached_total"]
    spec = sampler.spec_status()
    assert spec is not None and spec.active is True and spec.type == "draft-simple"
    drafted = sum(t["draft_n"] for t in timings)
    accepted = sum(t["draft_n_accepted"] for t in timings)
    assert spec.acceptance == pytest.approx(accepted / drafted)
    assert spec.accepted_per_step == pytest.approx(
        accepted / counters["spec_decode_num_drafts_total"]
    )
    assert len(sampler.history) == 5 + len(live)


async def test_two_slots_at_once_are_each_counted_at_their_own_rate():
    seen, lines = http_seen("two_slots"), engine_lines("two_slots")
    timings = seen["timings"]
    engine, clock, log = Engine(seen["metrics"][0], seen["slots_idle"]), Clock(), EngineLog()
    sampler = Sampler("http://engine", os.getpid(), log, clock=clock)
    async with httpx.AsyncClient(transport=httpx.MockTransport(engine.handler)) as client:
        await sampler.sample_once(client)
        busy = []
        for poll in seen["live"]:
            engine.metrics, engine.slots = poll["metrics"], poll["slots"]
            clock.now_s = 1000.0 + poll["at_s"] - seen["live"][0]["at_s"]
            sample = await sampler.sample_once(client)
            assert sample is not None
            busy.append(sample.slots_busy)
        for line in lines:
            log.feed(line)
        engine.metrics, engine.slots = seen["metrics"][-1], seen["slots_idle"]
        clock.now_s += 1
        sample = await sampler.sample_once(client)
    assert 2 in busy
    assert sampler.spec_status() is None  # no speculation planned
    assert sample is not None and sample.requests_finished == 2
    steps = sum(t["predicted_n"] - 1 for t in timings)
    seconds = sum(t["predicted_ms"] for t in timings) / 1000
    assert sample.decode_tokens_per_s == pytest.approx(steps / seconds, rel=1e-4)
    assert sample.prefill_tokens_total == sum(t["prompt_n"] for t in timings)


def test_progress_is_replaced_by_the_finished_request():
    log = EngineLog()
    for line in engine_lines("two_slots"):
        log.feed(line)
    first, second = log.take_finished()
    window = RateWindow(window_s=10)
    window.add_progress({first.task_id: 5}, 100.0)
    window.add_progress({first.task_id: 15}, 101.0)
    assert window.rates(101.0).decode_tokens_per_s == pytest.approx(10.0)
    window.add_finished(first, 102.0)
    assert window.rates(102.0).decode_tokens_per_s == pytest.approx(
        first.decode_steps / first.decode_s
    )
    window.add_finished(second, 103.0)
    both = (first.decode_steps + second.decode_steps) / (first.decode_s + second.decode_s)
    assert window.rates(103.0).decode_tokens_per_s == pytest.approx(both)
    later = window.rates(112.5)
    assert later.decode_tokens_per_s == pytest.approx(second.decode_steps / second.decode_s)
    assert later.cached_prompt_share == 0.0  # neither prompt was in the cache
    assert window.rates(120.0) == WindowRates(None, None, None, None, None)


def test_with_last_rates_fills_only_missing_rates():
    last = Sample(1.0, 50.0, 900.0, 0.2, 0.7, None, None, None, None, 1)
    now = Sample(2.0, None, 1200.0, None, None, 5, 9, None, None, 0)
    merged = with_last_rates(last, now)
    assert (merged.decode_tokens_per_s, merged.prefill_tokens_per_s) == (50.0, 1200.0)
    assert (merged.ttft_s, merged.spec_acceptance, merged.at_s) == (0.2, 0.7, 2.0)
    assert with_last_rates(None, now) is now


async def test_sampler_returns_none_when_metrics_are_off():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(501, text="This server does not support metrics endpoint.")

    sampler = Sampler("http://engine", os.getpid(), EngineLog())
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        assert await sampler.sample_once(client) is None


async def test_a_refused_draft_shows_as_inactive_with_the_engines_reason():
    seen, log = http_seen("spec_refused"), EngineLog()
    for line in engine_lines("spec_refused"):
        log.feed(line)
    engine = Engine(seen["metrics"][-1], seen["slots_idle"])
    sampler = Sampler("http://engine", os.getpid(), log, spec_type="draft-simple")
    async with httpx.AsyncClient(transport=httpx.MockTransport(engine.handler)) as client:
        sample = await sampler.sample_once(client)
    assert sample is not None and sample.requests_finished == 1
    spec = sampler.spec_status()
    assert spec is not None and spec.active is False
    assert spec.reason == (
        "the engine could not start it: draft model vocab type must match target model to use "
        "speculation"
    )
    assert (spec.acceptance, spec.accepted_per_step) == (None, None)


async def test_a_launch_on_two_gpus_samples_the_engine_s_bytes_and_load_on_each():
    seen = http_seen("spec")
    engine = Engine(seen["metrics"][0], seen["slots_idle"])
    me = os.getpid()
    cards = [FakeGpu(processes=[(me, 3 * 2**30), (1, 2**30)]), FakeGpu(processes=[(me, 2**30)])]
    nvml = FakeNvml(gpus=cards)
    two = Sampler("http://engine", me, EngineLog(), nvml=nvml, gpu_indices=(0, 1))
    one = Sampler("http://engine", me, EngineLog(), nvml=nvml, gpu_indices=(0,))
    async with httpx.AsyncClient(transport=httpx.MockTransport(engine.handler)) as client:
        split = await two.sample_once(client)
        alone = await one.sample_once(client)
    assert split is not None and split.gpu_loads == ((0, 3 * 2**30, 7), (1, 2**30, 7))
    assert alone is not None and alone.gpu_loads == ()
