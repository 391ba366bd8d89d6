"""The preset choice: every preset with what it gets on this card."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from lucebox.app.tui.screens.browser import HubFinder, ModelBrowserScreen
from lucebox.engine.core.units import gib_text
from lucebox.engine.plan.sources import presetchoice


class PresetScreen(ModalScreen[str | None]):
    """Every preset with what it gets on this card; Enter picks one, "/" finds a model on the
    Hub (dismissed with its pinned source, which has a "/" no preset id has)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss_none", "Back"),
        Binding("slash", "browse", "Search the Hub"),
    ]

    def __init__(self, table: presetchoice.PresetTable, finder: HubFinder | None = None) -> None:
        super().__init__()
        self.table = table
        self.finder = finder
        """Where "/" searches the Hub; the result is a model source instead of a preset id."""

    def compose(self) -> ComposeResult:
        budget = self.table.budget
        with Vertical(id="presets"):
            yield Static(
                f"Choose a model set for {budget.device} ({gib_text(budget.vram_free_bytes)} free)",
                id="presets-title",
            )
            yield DataTable(id="preset-table", cursor_type="row", zebra_stripes=True)
            yield Static(
                "Enter picks · / searches the Hub · Esc goes back · ★ what fits best",
                id="presets-help",
            )

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("", "Preset", "Card", "Engine", "Context", "KV", "Memory", "Model set")
        best = self.table.best
        for item in self.table.plans:
            fits = not item.misfit
            table.add_row(
                "★" if best is not None and item is best else "",
                item.alias,
                f"{item.preset.vram_tier_gib} GB"
                if item.preset and item.preset.vram_tier_gib
                else "any",
                item.engine_kind,
                f"{item.plan.ctx:,}" if fits else f"no: {item.misfit}",
                item.plan.cache_type_k if fits else "",
                gib_text(item.plan.memory_bytes.total),
                item.title,
                key=item.alias,
            )
        if best is not None:
            table.move_cursor(row=table.get_row_index(best.alias))
        table.focus()

    @on(DataTable.RowSelected)
    def choose(self, event: DataTable.RowSelected) -> None:
        self.dismiss(str(event.row_key.value))

    def action_dismiss_none(self) -> None:
        self.dismiss(None)

    def action_browse(self) -> None:
        if self.finder is not None:
            self.app.push_screen(ModelBrowserScreen(self.finder), self._browsed)

    def _browsed(self, source: str | None) -> None:
        if source is not None:
            self.dismiss(source)
