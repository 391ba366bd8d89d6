"""Decode, prefill and the engine's time to first token: the value now and the last minute's
trend, then draft acceptance and how much of the prompts came from the cache.

The time to first token is the engine's own (its prompt time per request): queueing and the
network are not in it, so the row says "eng TTFT"."""

from __future__ import annotations

from collections import deque

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label

from lucebox.app.tui.widgets.readout import Readout, value_text
from lucebox.app.tui.widgets.trend import Trend
from lucebox.engine.metrics import Sample

SPARK_POINTS = 60


class ThroughputPanel(Vertical):
    def compose(self) -> ComposeResult:
        for key, title in (("decode", "decode"), ("prefill", "prefill"), ("ttft", "eng TTFT")):
            with Horizontal(classes="metric-row"):
                yield Label(title, classes="metric-name")
                yield Readout("—", id=f"{key}-value", classes="metric-value")
                yield Trend(id=f"{key}-spark")
        yield Readout("", id="spec-acceptance")
        yield Readout("", id="prompt-cache")

    def show_rates(self, history: deque[Sample], latest: Sample | None) -> None:
        shown = latest or Sample(0, None, None, None, None, None, None, None, None, 0)
        self.query_one("#decode-value", Readout).show(
            value_text(shown.decode_tokens_per_s, "tok/s")
        )
        self.query_one("#prefill-value", Readout).show(
            value_text(shown.prefill_tokens_per_s, "tok/s")
        )
        self.query_one("#ttft-value", Readout).show(value_text(shown.ttft_s, "s", 2))
        for key, field in (
            ("decode", "decode_tokens_per_s"),
            ("prefill", "prefill_tokens_per_s"),
            ("ttft", "ttft_s"),
        ):
            # A full-width window: an idle server's flat line stays equal and is not redrawn.
            points = [getattr(s, field) or 0.0 for s in history]
            padded = [0.0] * (SPARK_POINTS - len(points)) + points[-SPARK_POINTS:]
            self.query_one(f"#{key}-spark", Trend).show(padded)
        acceptance = self.query_one("#spec-acceptance", Readout)
        acceptance.display = shown.spec_acceptance is not None
        if shown.spec_acceptance is not None:
            acceptance.show(f"draft acceptance {shown.spec_acceptance:.0%}")
        cache = self.query_one("#prompt-cache", Readout)
        cache.display = shown.cached_prompt_share is not None
        if shown.cached_prompt_share is not None:
            cache.show(f"prompt tokens from cache {shown.cached_prompt_share:.0%}")
