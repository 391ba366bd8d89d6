"""How many people the server serves at once: the TUI's choice of server.users."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

USER_CHOICES = (1, 2, 4, 8)
"""The counts offered; `lucebox config set server.users N` takes any other."""


class UsersModal(ModalScreen[int | None]):
    """Pick the people served at once; the server is planned again with the choice."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, current: int) -> None:
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(id="users"):
            yield Static("People served at once (server.users)", id="users-title")
            yield Static(
                "llama-server gets one slot per person, sharing the context; the plan seats "
                "fewer where each would get too little, and says why. The Lucebox engine "
                "serves one at a time: the others queue. Choosing plans the server again.",
                id="users-detail",
            )
            with Horizontal(id="users-choices"):
                for count in USER_CHOICES:
                    yield Button(
                        str(count),
                        id=f"users-{count}",
                        variant="primary" if count == self.current else "default",
                    )
                yield Button("Cancel (esc)", id="users-cancel")

    @on(Button.Pressed)
    def choose(self, event: Button.Pressed) -> None:
        chosen = (event.button.id or "").removeprefix("users-")
        self.dismiss(int(chosen) if chosen.isdigit() else None)
