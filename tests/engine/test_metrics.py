"""Sampler arithmetic on scripted /metrics and /slots pages (the real engine is covered by the
serve end-to-end test; exact counter sequences cannot be produced on demand by it)."""

from __future__ import annotations

import os

import httpx
import pytest

from lucebox.engine.metrics import Sample, Sampler, live_decoded, parse_counters, with_last_rates
from tests.engine.fake_nvml import FakeGpu, FakeNvml


def metrics_page(
    prompt_tokens: int, prompt_s: float, predicted: int, predicted_s: float, processing: int = 0
) -> str:
    return (
        "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
        "# TYPE llamacpp:prompt_tokens_total counter\n"
        f"llamacpp:prompt_tokens_total {prompt_tokens}\n"
        f"llamacpp:prompt_seconds_total {prompt_s}\n"
        f"llamacpp:tokens_predicted_total {predicted}\n"
        f"llamacpp:tokens_predicted_seconds_total {predicted_s}\n"
        "llamacpp:predicted_tokens_seconds 0\n"
        f"llamacpp:requests_processing {processing}\n"
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 3\n'
    )


def slot(task: int, decoded: int, processing: bool = True) -> dict[str, object]:
    return {
        "id": 0,
        "id_task": task,
        "is_processing": processing,
        "next_token": [{"n_decoded": decoded}],
    }


def test_parse_counters_keeps_unlabelled_series_only() -> None:
    counters = parse_counters(metrics_page(10, 0.5, 20, 1.0))
    assert counters["prompt_tokens_total"] == 10
    assert "spec_decode_num_accepted_tokens_per_pos_total" not in counters


def test_live_decoded_counts_new_tasks_from_zero_and_skips_idle_slots() -> None:
    tokens, snapshot = live_decoded({}, [slot(7, 12), slot(8, 5, processing=False)])
    assert (tokens, snapshot) == (12, {(0, 7): 12})
    tokens, snapshot = live_decoded(snapshot, [slot(7, 40)])
    assert (tokens, snapshot) == (28, {(0, 7): 40})
    tokens, _ = live_decoded(snapshot, [slot(9, 3)])
    assert tokens == 3
    assert live_decoded({}, [{"id": "x"}, "junk", slot(1, -5)]) == (0, {(0, 1): -5})


def test_with_last_rates_fills_only_missing_rates() -> None:
    last = Sample(1.0, 50.0, 900.0, 0.2, 0.7, None, None, None, None, 1)
    now = Sample(2.0, None, 1200.0, None, None, 5, 9, None, None, 0)
    merged = with_last_rates(last, now)
    assert (merged.decode_tokens_per_s, merged.prefill_tokens_per_s) == (50.0, 1200.0)
    assert (merged.ttft_s, merged.spec_acceptance, merged.at_s) == (0.2, 0.7, 2.0)
    assert with_last_rates(None, now) is now


async def test_sampler_live_decode_then_ttft_when_the_request_finishes() -> None:
    # One long request: prompt processed in the first second, tokens stream for two more
    # seconds, then it finishes and the predicted counters move.
    script = [
        (metrics_page(0, 0.0, 0, 0.0), []),
        (metrics_page(300, 0.25, 0, 0.0, processing=1), [slot(4, 10)]),
        (metrics_page(300, 0.25, 0, 0.0, processing=1), [slot(4, 60)]),
        (metrics_page(300, 0.25, 101, 2.0), [slot(4, 101, processing=False)]),
        (metrics_page(300, 0.25, 101, 2.0), [slot(4, 101, processing=False)]),
    ]
    fetched: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        name = request.url.path.strip("/")
        fetched.append(name)
        page, slots = script[fetched.count("metrics") - 1]
        return (
            httpx.Response(200, text=page) if name == "metrics" else httpx.Response(200, json=slots)
        )

    gpu_holder = FakeGpu(processes=[(os.getpid(), 3 * 2**30)])
    sampler = Sampler("http://engine", os.getpid(), nvml=FakeNvml(gpus=[gpu_holder]))
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        samples = [await sampler.sample_once(client) for _ in script]
    first, prefill, decoding, finished, idle = samples
    assert first is not None and first.decode_tokens_per_s is None
    assert prefill is not None and prefill.prefill_tokens_per_s == pytest.approx(1200.0)
    assert prefill.slots_busy == 1 and prefill.ttft_s is None
    assert decoding is not None and decoding.decode_tokens_per_s is not None
    assert decoding.decode_tokens_per_s > 0 and decoding.requests_finished == 0
    assert finished is not None and finished.requests_finished == 1
    assert finished.decode_tokens_per_s == pytest.approx(50.5)
    assert finished.ttft_s == pytest.approx(0.25)
    assert finished.slots_busy == 0 and finished.slots_total == 1
    assert finished.vram_used_bytes == 3 * 2**30
    assert (finished.gpu_util_percent, finished.gpu_temperature_c) == (7, 41)
    assert finished.gpu_power_w == pytest.approx(42.5)
    assert len(sampler.history) == 5
    # Idle again: /slots is not asked, the slot count is kept.
    assert idle is not None and (idle.slots_busy, idle.slots_total) == (0, 1)
    assert fetched == ["metrics", "slots"] * 4 + ["metrics"]


async def test_sampler_without_slots_endpoint_uses_counters() -> None:
    pages = iter([metrics_page(0, 0, 0, 0), metrics_page(10, 0.1, 40, 0.5)])

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/slots":
            return httpx.Response(501, text="This server does not support slots endpoint.")
        return httpx.Response(200, text=next(pages))

    sampler = Sampler("http://engine", os.getpid())
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        await sampler.sample_once(client)
        sample = await sampler.sample_once(client)
    assert sample is not None and sample.decode_tokens_per_s == pytest.approx(80.0)
    assert sample.slots_total is None and sample.vram_used_bytes is None


async def test_sampler_returns_none_when_metrics_are_off() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(501, text="This server does not support metrics endpoint.")

    sampler = Sampler("http://engine", os.getpid())
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        assert await sampler.sample_once(client) is None
