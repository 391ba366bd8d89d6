"""The pipeline as a live checklist; on failure, what went wrong and the ways on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Button, Footer, Static

from lucebox.app.tui.messages import (
    AllowBaseRequested,
    CpuEngineRequested,
    PresetPickRequested,
    RetryRequested,
)
from lucebox.app.tui.screens.log import LogScreen
from lucebox.app.tui.widgets.steps import STEP_TITLES, StepRow
from lucebox.engine.pipeline import STEPS, StepEvent, StepName


@dataclass(frozen=True)
class Failure:
    """What the failure panel shows: the step that failed, what went wrong, what to do."""

    step: StepName
    message: str
    hint: str | None
    exit_code: int
    """What `lucebox up` exits with when the user quits here (docs/contracts.md's codes)."""
    allow_base_serves: bool = False
    """Allowing a base model would let the refused model be served."""
    cpu_engine_offered: bool = False
    """The GPU's CUDA engine cannot be built here; a CPU engine can (the user decides)."""


class StartScreen(Screen[None]):
    """The pipeline as a live checklist; on failure, what went wrong and what to do."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "retry", "Retry", show=False),
        Binding("p", "pick_preset", "Presets"),
        Binding("l", "open_log", "Log"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self, log_path: Path) -> None:
        super().__init__()
        self.log_path = log_path
        self.notes: list[str] = []
        """Notes of this pipeline run (warnings, an API key shown once), also in the log tail."""

    def compose(self) -> ComposeResult:
        with Vertical(id="start"):
            yield Static("lucebox · turning this PC into an LLM server", id="start-title")
            with Vertical(id="steps"):
                for step in STEPS:
                    yield StepRow(step)
            yield Static("", id="notes")
            with Vertical(id="failure"):
                yield Static("", id="failure-message")
                yield Static("", id="failure-hint")
                with Horizontal(id="failure-choices"):
                    yield Button("Retry", id="retry", variant="primary")
                    yield Button("Another preset", id="another-preset")
                    yield Button("Allow base model", id="allow-base")
                    yield Button("Build for the CPU", id="cpu-engine")
                    yield Button("Open log", id="open-log")
        yield Footer()

    def show_step(self, event: StepEvent) -> None:
        if event.state == "note":
            # Warnings and one-time facts (an API key) stay in view under the checklist.
            self.notes.append(f"{STEP_TITLES[event.step]}: {event.message}")
            self.query_one("#notes", Static).update("\n".join(self.notes))
            return
        self.query_one(f"#step-{event.step}", StepRow).show(event)

    def show_failure(self, failure: Failure) -> None:
        self.show_step(StepEvent(failure.step, "failed", failure.message))
        self.query_one("#failure").border_title = f"{STEP_TITLES[failure.step]} failed"
        self.query_one("#failure-message", Static).update(Text(failure.message, style="bold"))
        self.query_one("#failure-hint", Static).update(failure.hint or "")
        self.query_one("#allow-base").display = failure.allow_base_serves
        self.query_one("#cpu-engine").display = failure.cpu_engine_offered
        self.query_one("#failure").display = True
        self.query_one("#retry", Button).focus()

    def reset(self) -> None:
        self.query_one("#failure").display = False
        self.notes.clear()
        self.query_one("#notes", Static).update("")
        for row in self.query(StepRow):
            row.clear()

    @on(Button.Pressed, "#retry")
    def action_retry(self) -> None:
        self.post_message(RetryRequested())

    @on(Button.Pressed, "#another-preset")
    def action_pick_preset(self) -> None:
        self.post_message(PresetPickRequested())

    @on(Button.Pressed, "#allow-base")
    def allow_base_and_retry(self) -> None:
        self.post_message(AllowBaseRequested())

    @on(Button.Pressed, "#cpu-engine")
    def build_cpu_engine(self) -> None:
        self.post_message(CpuEngineRequested())

    @on(Button.Pressed, "#open-log")
    def action_open_log(self) -> None:
        self.app.push_screen(LogScreen(self.log_path))
