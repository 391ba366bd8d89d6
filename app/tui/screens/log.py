"""The engine's whole log file."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Footer, RichLog

from lucebox.app.tui.widgets.log import log_line


class LogScreen(Screen[None]):
    """The engine's log file, as lucebox wrote it."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,l", "app.pop_screen", "Back")]

    def __init__(self, log_path: Path) -> None:
        super().__init__()
        self.log_path = log_path

    def compose(self) -> ComposeResult:
        yield RichLog(id="full-log", max_lines=5000, markup=False)
        yield Footer()

    def on_mount(self) -> None:
        log = self.query_one(RichLog)
        log.border_title = str(self.log_path)
        try:
            lines = self.log_path.read_text("utf-8", errors="replace").splitlines()
        except OSError:
            lines = [f"no log yet at {self.log_path}"]
        for line in lines[-5000:]:
            log.write(log_line(line))
