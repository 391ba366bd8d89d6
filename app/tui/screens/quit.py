"""Leaving the dashboard: keep the model served, or stop it."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class QuitModal(ModalScreen[str]):
    """Quit: keep the model served in the background, or stop it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss('cancel')", "Cancel"),
        Binding("k", "dismiss('keep')", "Keep serving"),
        Binding("s", "dismiss('stop')", "Stop and quit"),
    ]

    def compose(self) -> ComposeResult:
        with Vertical(id="quit"):
            yield Static("Keep serving the model after the dashboard closes?", id="quit-title")
            yield Static(
                "In the background it restarts as a service (`lucebox status`, `lucebox down`).",
                id="quit-detail",
            )
            with Horizontal(id="quit-choices"):
                yield Button("Keep serving (k)", id="keep", variant="primary")
                yield Button("Stop and quit (s)", id="stop", variant="error")
                yield Button("Cancel (esc)", id="cancel")

    @on(Button.Pressed)
    def choose(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id or "cancel")
