"""The start-up checklist: one row per pipeline step."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, ProgressBar

from lucebox.engine.core import units
from lucebox.engine.core.downloadprogress import progress_parts
from lucebox.engine.pipeline import StepEvent, StepName

STEP_TITLES: dict[StepName, str] = {
    "gpu": "GPU",
    "preset": "Preset",
    "models": "Models",
    "engine": "Engine",
    "plan": "Plan",
    "server": "Server",
}


class StepRow(Horizontal):
    """One pipeline step: a mark, its name, what it is doing, and a bar while it has one."""

    MARKS: ClassVar[dict[str, str]] = {"pending": "·", "running": "…", "done": "✓", "failed": "✗"}

    def __init__(self, step: StepName) -> None:
        super().__init__(id=f"step-{step}", classes="step-row")
        self.step = step
        self.state = "pending"

    def compose(self) -> ComposeResult:
        yield Label(self.MARKS["pending"], classes="step-mark")
        yield Label(STEP_TITLES[self.step], classes="step-name")
        yield Label("", classes="step-message")
        yield ProgressBar(total=100, show_eta=False, classes="step-bar")
        yield Label("", classes="step-rate")

    def clear(self) -> None:
        self.state = "pending"
        self.show(StepEvent(self.step, "note", ""))

    def show(self, event: StepEvent) -> None:
        if event.state in ("running", "done", "failed"):
            self.state = event.state
        self.set_class(self.state == "running", "-running")
        self.set_class(self.state == "done", "-done")
        self.set_class(self.state == "failed", "-failed")
        self.query_one(".step-mark", Label).update(self.MARKS[self.state])
        self.query_one(".step-message", Label).update(event.message)
        bar = self.query_one(ProgressBar)
        rate = self.query_one(".step-rate", Label)
        showing_bar = event.fraction is not None and event.state == "running"
        bar.display = showing_bar
        rate.display = showing_bar
        if showing_bar and event.fraction is not None:
            bar.update(progress=event.fraction * 100)
            rate.update(rate_text(event))


def rate_text(event: StepEvent) -> str:
    """Percent, then for a download the same words as the CLI's progress line."""
    parts = [f"{event.fraction:.0%}"] if event.fraction is not None else []
    if event.attempt is not None:
        parts += progress_parts(
            event.rate_bytes_per_s,
            event.eta_s,
            attempt=event.attempt,
            waiting_s=event.waiting_s,
            retry_reason=event.retry_reason,
        )
    elif event.rate_bytes_per_s is not None:
        parts.append(units.rate_text(event.rate_bytes_per_s))
    return " · ".join(parts)
