"""lucebox's numbers as Prometheus text: the same series for the textfile `lucebox status
--prometheus` writes and for ``/metrics`` on the front, whichever engine serves."""

from __future__ import annotations

from lucebox.engine.run.runstate import Status


def prometheus_text(status: Status) -> str:
    """The status as Prometheus text (``status --prometheus``'s textfile, the front's
    ``/metrics``)."""
    sample, cache, spec, queue = status.sample, status.cache, status.spec, status.queue
    series: list[tuple[str, str, str, float | int | None]] = [
        ("up", "gauge", "1 while lucebox serves a ready engine", int(status.state == "ready")),
        ("restarts_total", "counter", "engine restarts of this server", status.restarts),
        (
            "decode_tokens_per_second",
            "gauge",
            "per-request decode rate, token-weighted over the sample window",
            sample.decode_tokens_per_s if sample else None,
        ),
        (
            "prefill_tokens_per_second",
            "gauge",
            "per-request prompt rate, token-weighted over the sample window",
            sample.prefill_tokens_per_s if sample else None,
        ),
        (
            "engine_ttft_seconds",
            "gauge",
            "engine-side time to first token (queueing and network excluded)",
            sample.ttft_s if sample else None,
        ),
        (
            "requests_finished_total",
            "counter",
            "requests the engine finished",
            sample.requests_finished_total if sample else None,
        ),
        (
            "vram_used_bytes",
            "gauge",
            "GPU memory the engine holds",
            sample.vram_used_bytes if sample else None,
        ),
        (
            "cached_prompt_share",
            "gauge",
            "share of prompt tokens taken from the cache",
            cache.cached_prompt_share if cache else None,
        ),
        (
            "full_reprocess_events_total",
            "counter",
            "whole prompts re-processed for lack of cache data",
            cache.full_reprocess_events if cache else None,
        ),
        (
            "spec_acceptance",
            "gauge",
            "share of draft tokens accepted",
            spec.acceptance if spec else None,
        ),
        ("queue_depth", "gauge", "requests waiting for the engine", queue.depth if queue else None),
        (
            "queue_oldest_wait_seconds",
            "gauge",
            "how long the oldest waiting request has waited",
            (queue.oldest_wait_s or 0) if queue else None,
        ),
        ("requests_running", "gauge", "requests in the engine", queue.running if queue else None),
        (
            "requests_served_total",
            "counter",
            "requests the front passed to the engine and saw finish",
            queue.served if queue else None,
        ),
        (
            "requests_rejected_total",
            "counter",
            "requests answered 503 because the queue was full",
            queue.rejected if queue else None,
        ),
    ]
    lines = []
    for name, kind, help_text, value in series:
        if value is not None:
            lines += [
                f"# HELP lucebox_{name} {help_text}",
                f"# TYPE lucebox_{name} {kind}",
                f"lucebox_{name} {value}",
            ]
    return "\n".join(lines) + "\n"
