"""Decode, prefill and the engine's time to first token: the value now and the last minute's
trend, then speculation's speed-up and draft acceptance (greedy and sampled replies apart where
the engine has figures for each) and how much of the prompts came from the cache, and a long
context's modes as measured on this card.

The time to first token is the engine's own (its prompt time per request): queueing and the
network are not in it, so the row says "eng TTFT"."""

from __future__ import annotations

from collections import deque

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Label

from lucebox.app.tui.widgets.readout import Readout, value_text
from lucebox.app.tui.widgets.trend import Trend
from lucebox.engine.plan.lucebox.kvmodeview import ModesStatus
from lucebox.engine.run.kinds.metrics import Sample
from lucebox.engine.run.sample import QueueStatus, SpecStatus

SPARK_POINTS = 60


class ThroughputPanel(Vertical):
    def compose(self) -> ComposeResult:
        for key, title in (("decode", "decode"), ("prefill", "prefill"), ("ttft", "eng TTFT")):
            with Horizontal(classes="metric-row"):
                yield Label(title, classes="metric-name")
                yield Readout("—", id=f"{key}-value", classes="metric-value")
                yield Trend(id=f"{key}-spark")
        yield Readout("", id="spec-and-cache")
        yield Readout("", id="kv-modes")

    def show_rates(
        self,
        history: deque[Sample],
        latest: Sample | None,
        spec: SpecStatus | None = None,
        queue: QueueStatus | None = None,
        kv_modes: ModesStatus | None = None,
    ) -> None:
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
        line = spec_line(spec, shown.spec_acceptance) or Text()
        if shown.cached_prompt_share is not None:
            line.append(" · " if line else "")
            line.append(f"cache {shown.cached_prompt_share:.0%} of prompt")
        if queue is not None and queue.depth:
            line.append(" · " if line else "")
            line.append(f"{queue.depth} waiting, oldest {queue.oldest_wait_s or 0:.0f} s")
        readout = self.query_one("#spec-and-cache", Readout)
        readout.display = bool(line)
        readout.show(line)
        modes = self.query_one("#kv-modes", Readout)
        lines = kv_modes.lines() if kv_modes is not None else []
        modes.display = bool(lines)
        modes.show(Text("long context: " + "\n".join(lines)) if lines else Text())


def spec_line(spec: SpecStatus | None, acceptance: float | None) -> Text | None:
    """Speculation in one line; loud when it was planned and does not run."""
    if spec is None:
        return None if acceptance is None else Text(f"draft acceptance {acceptance:.0%}")
    headline = spec.headline()
    if spec.active is False and headline is not None:
        return Text(headline, style="bold yellow")  # measured slower here: off on purpose
    if spec.active is False:
        return Text(f"{spec.type} is OFF: {spec.reason}", style="bold red")
    if (apart := spec.sampling_text()) is not None:
        # Greedy and sampled replies apart: one figure for both says little of either.
        line = Text(spec.mode_name, style="bold")
        line.append(f" · {apart}")
    else:
        line = Text(headline or spec.type, style="bold")
        if spec.acceptance is not None:
            line.append(f" · {spec.acceptance:.0%} of drafts accepted")
    if spec.accepted_per_step is not None:
        line.append(f" · {spec.accepted_per_step:.1f} per step")
    return line
