"""The card's memory as planned and used, and its live load."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical

from lucebox.app.tui.widgets.readout import Readout
from lucebox.engine.core.units import gib_text, to_gib
from lucebox.engine.pipeline import Prepared
from lucebox.engine.run.kinds.metrics import Sample


def vram_bar(
    prepared: Prepared, used_bytes: int | None, width: int, sample: Sample | None = None
) -> Text:
    """The planned split of the card (weights / KV / draft / other / free), scaled to width.

    The legend breaks between entries, never inside one.
    """
    memory = prepared.plan.memory_bytes
    other = memory.total - memory.weights - memory.kv - memory.draft
    free = max(prepared.vram_free_bytes - memory.total, 0)
    parts = [
        (memory.weights, "weights", "#5f87d7"),
        (memory.kv, "KV", "#87af5f"),
        (memory.draft, "draft", "#af87d7"),
        (other, "other", "#808080"),
        (free, "free", "#303030"),
    ]
    whole = sum(size for size, _, _ in parts) or 1
    bar = Text()
    for size, _, colour in parts:
        cells = round(width * size / whole)
        bar.append("█" * cells, style=colour)
    legend = [(f"{label} {to_gib(size):.1f}", colour) for size, label, colour in parts if size]
    legend[-1] = (legend[-1][0] + " GiB", legend[-1][1])
    line_cells = width
    for entry, colour in legend:
        if line_cells + len(entry) + 3 > width:
            bar.append("\n")
            line_cells = 0
        elif line_cells:
            bar.append(" ")
            line_cells += 1
        bar.append("■", style=colour)
        bar.append(f" {entry}")
        line_cells += len(entry) + 2
    bar.append(f"\nplan {to_gib(memory.total):.2f} of {gib_text(prepared.vram_free_bytes)}")
    if used_bytes is not None:
        bar.append(f" · uses {to_gib(used_bytes):.2f}")
    return bar + device_bars(prepared, width, sample)


def device_bars(prepared: Prepared, width: int, sample: Sample | None = None) -> Text:
    """One bar per device of a split plan or a two-card placement (GPUs and RPC peers): its
    planned share against its room, then what the engine uses there and the card's load (a
    GPU of this PC, once sampled)."""
    devices = prepared.launch.budget.devices
    shares = prepared.plan.device_bytes
    bars = Text()
    if len(shares) < 2 or len(devices) != len(shares):
        return bars
    live = {index: (used, util) for index, used, util in (sample.gpu_loads if sample else ())}
    for device, (name, planned) in zip(devices, shares, strict=True):
        room = max(device.vram_free_bytes, planned, 1)
        cells = round(width * planned / room)
        bars.append(f"\n{name}\n")
        bars.append("█" * cells, style="#5f87d7")
        bars.append("█" * (width - cells), style="#303030")
        bars.append(f"\nplan {to_gib(planned):.2f} of {gib_text(device.vram_free_bytes)}")
        used, util = live.get(device.index, (None, None)) if not device.address else (None, None)
        if used is not None:
            bars.append(f" · uses {to_gib(used):.2f}")
        if util is not None:
            bars.append(f" · GPU {util}%")
    return bars


class GpuPanel(Vertical):
    """The card's memory as planned and used, then its live load, temperature and power.

    The memory bar changes only with what the engine allocates, so each second redraws just
    the two live lines under it.
    """

    def compose(self) -> ComposeResult:
        yield Readout("", id="vram")
        yield Readout("", id="gpu-live")

    def show_gpu(self, prepared: Prepared, sample: Sample | None) -> None:
        width = max(self.content_size.width, 10)
        used = sample.vram_used_bytes if sample else None
        if sample and sample.gpu_loads:  # the engine on several cards: all of what it uses
            used = sum(card_used or 0 for _, card_used, _ in sample.gpu_loads)
        bars = vram_bar(prepared, used, width, sample)
        self.query_one("#vram", Readout).show(bars, layout=True)
        if sample is None:
            return
        device = [
            f"GPU {sample.gpu_util_percent}%" if sample.gpu_util_percent is not None else "",
            f"{sample.gpu_temperature_c}°C" if sample.gpu_temperature_c is not None else "",
            f"{sample.gpu_power_w:.0f} W" if sample.gpu_power_w is not None else "",
        ]
        engine = [
            f"CPU {sample.engine_cpu_percent:.0f}%"
            if sample.engine_cpu_percent is not None
            else "",
            f"RAM {gib_text(sample.engine_rss_bytes, 2)}"
            if sample.engine_rss_bytes is not None
            else "",
            f"slots {sample.slots_busy or 0}/{sample.slots_total}"
            if sample.slots_total is not None
            else "",
        ]
        lines = [" · ".join(f for f in facts if f) for facts in (device, engine)]
        self.query_one("#gpu-live", Readout).show("\n".join(line for line in lines if line))
