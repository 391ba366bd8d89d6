"""A served set's models, one row each: state (with load progress), memory, last use, device."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from lucebox.engine.core.units import gib_text, to_gib
from lucebox.engine.run.sample import GpuStatus
from lucebox.engine.run.servedsetmodels import ModelStatus

COLUMNS: tuple[tuple[str, str], ...] = (
    ("model", "Model"),
    ("state", "State"),
    ("memory", "Memory (now of planned)"),
    ("used", "Last used"),
    ("device", "Device"),  # last: a card's full name is long, and the panel's title has it
)
STATE_STYLES = {"loaded": "green", "loading": "yellow", "sleeping": "cyan", "unloaded": "dim"}
BAR_CELLS = 10


def card_lines(models: tuple[ModelStatus, ...], gpus: tuple[GpuStatus, ...]) -> list[str]:
    """Per card: what the plan puts there (its models' planned bytes), what the card holds
    now and its load."""
    lines = []
    for gpu in gpus:
        planned = sum(m.planned_bytes for m in models if m.device.startswith(f"GPU {gpu.index}:"))
        load = f" · load {gpu.util_percent}%" if gpu.util_percent is not None else ""
        lines.append(
            f"GPU {gpu.index} · plan {to_gib(planned):.2f} · uses {to_gib(gpu.vram_used_bytes):.2f}"
            f" of {gib_text(gpu.vram_total_bytes)}{load}"
        )
    return lines


def state_text(model: ModelStatus) -> Text:
    """The state, and while a model loads how far it is (when the router has said)."""
    text = Text(model.state, style=STATE_STYLES[model.state])
    if model.state == "loading" and model.load_progress is not None:
        filled = round(model.load_progress * BAR_CELLS)
        text.append(f" {'█' * filled}{'░' * (BAR_CELLS - filled)} {model.load_progress:.0%}")
    return text


def used_text(last_used_s: float | None) -> str:
    if last_used_s is None:
        return "—"
    return f"{last_used_s:.0f} s ago" if last_used_s < 120 else f"{last_used_s // 60:.0f} min ago"


def model_cells(model: ModelStatus) -> dict[str, str | Text]:
    """The row of one model, by column key."""
    return {
        "model": Text(model.alias, style="bold"),
        "state": state_text(model),
        "memory": f"{gib_text(model.memory_bytes, 2)} of {gib_text(model.planned_bytes, 2)}",
        "used": used_text(model.last_used_s),
        "device": model.device,
    }


class ModelTable(DataTable[str | Text]):
    """The set's models; the row under the cursor is the one the load and unload keys act on."""

    def on_mount(self) -> None:
        self.cursor_type = "row"
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    def show_models(self, models: tuple[ModelStatus, ...]) -> None:
        """Rows updated in place, so the cursor stays on its model."""
        for model in models:
            cells = model_cells(model)
            if model.alias not in self.rows:
                self.add_row(*cells.values(), key=model.alias)
                continue
            for column, value in cells.items():
                # A load's bar makes the state wider than any word: the column grows.
                self.update_cell(model.alias, column, value, update_width=True)

    @property
    def selected(self) -> str | None:
        """The alias of the model under the cursor; None before any row is there."""
        if not self.rows:
            return None
        return str(self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value)
