"""lucebox's numbers as Prometheus text: the same series for the textfile `lucebox status
--prometheus` writes and for ``/metrics`` on the front, whichever engine serves."""

from __future__ import annotations

from lucebox.engine.run.runstate import Status

_Row = tuple[str, str, str, str]
"""One series: its name, Prometheus type, help text and the attribute it reads."""

_SERIES: tuple[tuple[str, tuple[_Row, ...]], ...] = (
    (
        "sample",
        (
            (
                "decode_tokens_per_second",
                "gauge",
                "per-request decode rate, token-weighted over the sample window",
                "decode_tokens_per_s",
            ),
            (
                "prefill_tokens_per_second",
                "gauge",
                "per-request prompt rate, token-weighted over the sample window",
                "prefill_tokens_per_s",
            ),
            (
                "engine_ttft_seconds",
                "gauge",
                "engine-side time to first token (queueing and network excluded)",
                "ttft_s",
            ),
            (
                "requests_finished_total",
                "counter",
                "requests the engine finished",
                "requests_finished_total",
            ),
            ("vram_used_bytes", "gauge", "GPU memory the engine holds", "vram_used_bytes"),
        ),
    ),
    (
        "cache",
        (
            (
                "cached_prompt_share",
                "gauge",
                "share of prompt tokens taken from the cache",
                "cached_prompt_share",
            ),
            (
                "full_reprocess_events_total",
                "counter",
                "whole prompts re-processed for lack of cache data",
                "full_reprocess_events",
            ),
        ),
    ),
    ("spec", (("spec_acceptance", "gauge", "share of draft tokens accepted", "acceptance"),)),
    (
        "queue",
        (
            ("queue_depth", "gauge", "requests waiting for the engine", "depth"),
            (
                "queue_oldest_wait_seconds",
                "gauge",
                "how long the oldest waiting request has waited",
                "oldest_wait_s",
            ),
            ("requests_running", "gauge", "requests in the engine", "running"),
            (
                "requests_served_total",
                "counter",
                "requests the front passed to the engine and saw finish",
                "served",
            ),
            (
                "requests_rejected_total",
                "counter",
                "requests answered 503 because the queue was full",
                "rejected",
            ),
        ),
    ),
)
"""The series read from each part of the status; a part the status lacks gives none."""

_ZERO_WHEN_NONE = frozenset({"queue_oldest_wait_seconds"})
"""Series that read 0 where their part is present but the value is not (no request waits)."""


def _values(status: Status) -> list[tuple[str, str, str, float | int | None]]:
    """Every series with its value now (None: not known, left out)."""
    found: list[tuple[str, str, str, float | int | None]] = [
        ("up", "gauge", "1 while lucebox serves a ready engine", int(status.state == "ready")),
        ("restarts_total", "counter", "engine restarts of this server", status.restarts),
    ]
    for part_name, rows in _SERIES:
        part = getattr(status, part_name)
        for name, kind, help_text, attribute in rows:
            value = getattr(part, attribute) if part is not None else None
            if value is None and part is not None and name in _ZERO_WHEN_NONE:
                value = 0
            found.append((name, kind, help_text, value))
    return found


def prometheus_text(status: Status) -> str:
    """The status as Prometheus text (``status --prometheus``'s textfile, the front's
    ``/metrics``)."""
    lines = []
    for name, kind, help_text, value in _values(status):
        if value is not None:
            lines += [
                f"# HELP lucebox_{name} {help_text}",
                f"# TYPE lucebox_{name} {kind}",
                f"lucebox_{name} {value}",
            ]
    return "\n".join(lines + _key_lines(status)) + "\n"


def _key_lines(status: Status) -> list[str]:
    """Each key's use, labelled by the key's name (never the key)."""
    if not status.keys:
        return []
    lines = []
    for name, help_text, attribute in (
        ("key_requests_total", "requests each key made since the start", "requests"),
        ("key_tokens_total", "tokens generated for each key since the start", "tokens"),
    ):
        lines += [f"# HELP lucebox_{name} {help_text}", f"# TYPE lucebox_{name} counter"]
        lines += [
            f'lucebox_{name}{{key="{use.name}"}} {getattr(use, attribute)}' for use in status.keys
        ]
    return lines
