"""A served set at a glance: its address, each model's state (with load progress), device,
memory and last use, and the engine log; keys load and unload the model under the cursor."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Footer

from lucebox.app.tui.messages import ModelLoadRequested, ModelUnloadRequested
from lucebox.app.tui.screens.dashboardbase import (
    COPY_URL,
    KEYS,
    OPEN_LOG,
    QUIT,
    RESTART,
    STOP,
    ServingScreen,
    format_duration,
    restarts_text,
)
from lucebox.app.tui.widgets.log import LogTail
from lucebox.app.tui.widgets.models import ModelTable, card_lines
from lucebox.app.tui.widgets.readout import Readout
from lucebox.engine.run.sample import GpuStatus
from lucebox.engine.run.servedsetmodels import ModelStatus
from lucebox.engine.servedset import PreparedSet


class ServedSetDashboardScreen(ServingScreen):
    """The served set: one row a model; o loads the one under the cursor, u unloads it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("o", "load_model", "Load"),
        Binding("u", "unload_model", "Unload"),
        RESTART,
        STOP,
        OPEN_LOG,
        COPY_URL,
        KEYS,
        QUIT,
    ]

    def __init__(
        self,
        prepared: PreparedSet,
        models: tuple[ModelStatus, ...],
        *,
        url: str,
        log_path: Path,
        notes: list[str],
        clock: Callable[[], float],
    ) -> None:
        super().__init__(url=url, log_path=log_path, notes=notes, clock=clock)
        self.prepared = prepared
        self.models = models
        self.gpus: tuple[GpuStatus, ...] = ()

    def compose(self) -> ComposeResult:
        yield Readout("", id="dash-header")
        yield ModelTable(id="models")
        yield LogTail(id="log-tail")
        yield Footer()

    def on_mount(self) -> None:
        planned = self.prepared.planned
        self.query_one("#models").border_title = f"Models · {planned.budget.device}"
        engine = planned.launches[0].engine.version
        self.query_one("#log-tail").border_title = f"Router log · {engine}"
        self.refresh_header()
        self.show_models(self.models)
        self.query_one(LogTail).add([f"# lucebox: {note}" for note in self.notes])
        self.query_one(ModelTable).focus()

    def refresh_header(self) -> None:
        uptime_s = self.clock() - self.server_started_at
        header = Text()
        header.append(f"a set of {len(self.prepared.planned.launches)}", style="bold cyan")
        header.append("  ")
        header.append(self.state, style=f"bold {self.state_style}")
        header.append(f" · up {format_duration(uptime_s)} · ")
        header.append(restarts_text(self.restarts, self.trials))
        header.append(" · a model loads when a request names it\n")
        header.append(f"{self.url}/v1", style="bold underline")
        header.append("  y copies it", style="dim")
        for line in card_lines(self.models, self.gpus):
            header.append(f"\n{line}")
        self.show_header(header)

    def show_models(
        self, models: tuple[ModelStatus, ...], gpus: tuple[GpuStatus, ...] = ()
    ) -> None:
        self.models = models
        self.gpus = gpus or self.gpus
        self.query_one(ModelTable).show_models(models)
        self.refresh_header()

    def action_load_model(self) -> None:
        alias = self.query_one(ModelTable).selected
        if alias is not None:
            self.post_message(ModelLoadRequested(alias))

    def action_unload_model(self) -> None:
        alias = self.query_one(ModelTable).selected
        if alias is not None:
            self.post_message(ModelUnloadRequested(alias))
