"""When the engine sleeps to free the GPU: the TUI's choice of server.sleep_idle_s."""

from __future__ import annotations

import math
from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

from lucebox.engine.run.sleep import RULE, SLEEP_CHOICES_S, idle_text


class SleepModal(ModalScreen[float | None]):
    """Pick the idle time before the engine sleeps (0: never); the server starts again with
    the choice."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, current_s: float) -> None:
        super().__init__()
        self.current_s = current_s

    def compose(self) -> ComposeResult:
        with Vertical(id="sleep"):
            yield Static("Sleep when idle (server.sleep_idle_s)", id="sleep-title")
            yield Static(f"{RULE} Choosing starts the server again with it.", id="sleep-detail")
            with Horizontal(id="sleep-choices"):
                for idle_s in SLEEP_CHOICES_S:
                    yield Button(
                        idle_text(idle_s),
                        id=f"sleep-{idle_s:.0f}",
                        variant="primary" if idle_s == self.current_s else "default",
                    )
                yield Button("Cancel (esc)", id="sleep-cancel")
            custom = self.current_s not in SLEEP_CHOICES_S
            with Horizontal(id="sleep-custom-row"):
                yield Static("or after", classes="sleep-label")
                yield Input(
                    f"{self.current_s / 60:g}" if custom else "",
                    placeholder="minutes",
                    type="number",
                    id="sleep-custom",
                )
                yield Static("minutes idle (enter)", classes="sleep-label")
            yield Static("", id="sleep-error")

    @on(Button.Pressed)
    def choose(self, event: Button.Pressed) -> None:
        chosen = (event.button.id or "").removeprefix("sleep-")
        self.dismiss(float(chosen) if chosen.isdigit() else None)

    @on(Input.Submitted, "#sleep-custom")
    def choose_custom(self, event: Input.Submitted) -> None:
        try:
            minutes = float(event.value)
        except ValueError:
            minutes = -1.0
        if not math.isfinite(minutes) or minutes < 0:
            self.query_one("#sleep-error", Static).update("minutes: a number, 0 for never")
            return
        self.dismiss(round(minutes * 60, 1))
