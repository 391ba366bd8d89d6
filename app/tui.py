"""The Textual front end of `lucebox up`: start-up checklist, preset choice, dashboard, chat.

Widgets render what ``lucebox.engine`` computes: pipeline steps (``StepEvent``), the plan, the
supervisor's events and the sampler's ``Sample`` stream. Blocking work (GPU probe, downloads,
builds) runs in a thread worker that only posts messages; the server runs in an async worker.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import httpx
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.color import Color
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import (
    Button,
    DataTable,
    Footer,
    Input,
    Label,
    ProgressBar,
    RichLog,
    Static,
)
from textual.worker import get_current_worker

from lucebox.engine import config, gpu, planning, registry, service
from lucebox.engine.chat import ChatError, stream_chat
from lucebox.engine.errors import LuceboxError
from lucebox.engine.launch import url_of
from lucebox.engine.metrics import Sample, with_last_rates
from lucebox.engine.paths import Paths
from lucebox.engine.planning import ServeOptions
from lucebox.engine.service import STEPS, Prepared, StepEvent, StepName
from lucebox.engine.supervisor import ServerEvent, Supervisor

GIB = 2**30
STEP_TITLES: dict[StepName, str] = {
    "gpu": "GPU",
    "preset": "Preset",
    "models": "Models",
    "engine": "Engine",
    "plan": "Plan",
    "server": "Server",
}
SPARK_POINTS = 60
LOG_TAIL_INTERVAL_S = 2.0
# The engine's level letter follows its timestamp ("0.01.234.567 W srv ..."); see the contract.
LOG_ERROR = re.compile(r"(?i:\berror\b|\bfailed\b)|^(?:[\d.]+ )?E ")
LOG_WARNING = re.compile(r"(?i:\bwarn(ing)?\b)|^(?:[\d.]+ )?W ")


class Readout(Label):
    """A label redrawn only when its text changes, so a dashboard at rest costs next to nothing.

    Its size is fixed by CSS, so a change needs no layout pass, unless ``layout`` says the text
    may take a different number of lines.
    """

    def show(self, content: Text | str, layout: bool = False) -> None:
        if content != getattr(self, "shown", None):
            self.shown = content
            self.update(content, layout=layout)


class Backend:
    """What the TUI asks of the engine; tests replace it with a scripted one for faults."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths

    def first_run(self) -> bool:
        """No preset chosen yet: the user picks one from the plan table."""
        return not config.load_settings(self.paths).preset

    def preset_table(self, options: ServeOptions) -> planning.PresetTable:
        settings = config.load_settings(self.paths)
        probe = gpu.probe_gpus()
        resolved = planning.resolve(options, settings)
        budget = planning.budget_for(probe, resolved.gpu_index)
        installed = registry.select_engine(self.paths, probe, settings.engine).engine
        engine = planning.EngineView.of(installed)
        return planning.preset_table(self.paths, options, settings, budget, engine)

    def choose_preset(self, preset_id: str) -> None:
        config.set_setting(self.paths, "preset", preset_id)

    def lock(self) -> service.ServeLock:
        return service.ServeLock(self.paths)

    def prepare(self, options: ServeOptions, emit: service.Emit) -> Prepared:
        return service.prepare(self.paths, options, emit)

    def supervisor(self, prepared: Prepared) -> Supervisor:
        return service.new_supervisor(self.paths, prepared)

    def run(
        self, prepared: Prepared, supervisor: Supervisor
    ) -> AsyncIterator[ServerEvent | Sample]:
        return service.run_server(self.paths, prepared, supervisor)

    def detach(self, options: ServeOptions) -> tuple[int, Path]:
        return service.start_detached(self.paths, options)

    @property
    def log_path(self) -> Path:
        return service.engine_log(self.paths)


# --- messages ---------------------------------------------------------------------------------


@dataclass
class StepChanged(Message):
    event: StepEvent

    def can_replace(self, message: Message) -> bool:
        # Download and build progress come many times a second: keep the newest.
        return (
            isinstance(message, StepChanged)
            and message.event.step == self.event.step
            and message.event.fraction is not None
            and self.event.fraction is not None
        )


@dataclass
class PipelineFailed(Message):
    step: StepName
    message: str
    hint: str | None


@dataclass
class PipelinePrepared(Message):
    prepared: Prepared


@dataclass
class ServerChanged(Message):
    event: ServerEvent


@dataclass
class MetricsSampled(Message):
    sample: Sample


# --- start-up screen ----------------------------------------------------------------------------


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
    parts = [f"{event.fraction:.0%}"] if event.fraction is not None else []
    if event.rate_bytes_per_s is not None:
        parts.append(f"{event.rate_bytes_per_s / 2**20:.1f} MiB/s")
    if event.eta_s is not None:
        parts.append(f"{event.eta_s:.0f} s left")
    return " · ".join(parts)


class StartScreen(Screen[None]):
    """The pipeline as a live checklist; on failure, what went wrong and what to do."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "retry", "Retry", show=False),
        Binding("p", "pick_preset", "Presets"),
        Binding("l", "open_log", "Log"),
        Binding("q", "app.quit", "Quit"),
    ]

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
                    yield Button("Open log", id="open-log")
        yield Footer()

    def show_step(self, event: StepEvent) -> None:
        if event.state == "note":
            # Warnings and one-time facts (an API key) stay in view under the checklist.
            self.notes.append(f"{STEP_TITLES[event.step]}: {event.message}")
            self.query_one("#notes", Static).update("\n".join(self.notes))
            return
        self.query_one(f"#step-{event.step}", StepRow).show(event)

    @property
    def notes(self) -> list[str]:
        return self.app_.notes

    def show_failure(self, failed: PipelineFailed) -> None:
        self.show_step(StepEvent(failed.step, "failed", failed.message))
        self.query_one("#failure").border_title = f"{STEP_TITLES[failed.step]} failed"
        self.query_one("#failure-message", Static).update(Text(failed.message, style="bold"))
        self.query_one("#failure-hint", Static).update(failed.hint or "")
        base_refused = "base-model" in failed.message or "base model" in failed.message
        self.query_one("#allow-base").display = base_refused
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
        self.app_.start_pipeline()

    @on(Button.Pressed, "#another-preset")
    def action_pick_preset(self) -> None:
        self.app_.pick_preset()

    @on(Button.Pressed, "#allow-base")
    def allow_base_and_retry(self) -> None:
        self.app_.options = replace(self.app_.options, allow_base=True)
        self.app_.start_pipeline()

    @on(Button.Pressed, "#open-log")
    def action_open_log(self) -> None:
        self.app.push_screen(LogScreen(self.app_.backend.log_path))

    @property
    def app_(self) -> LuceboxApp:
        assert isinstance(self.app, LuceboxApp)
        return self.app


# --- preset choice --------------------------------------------------------------------------------


class PresetScreen(ModalScreen[str | None]):
    """Every preset with what it gets on this card; Enter picks one."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss_none", "Back")]

    def __init__(self, table: planning.PresetTable) -> None:
        super().__init__()
        self.table = table

    def compose(self) -> ComposeResult:
        budget = self.table.budget
        with Vertical(id="presets"):
            yield Static(
                f"Choose a model set for {budget.device} ({budget.free_bytes / GIB:.1f} GiB free)",
                id="presets-title",
            )
            yield DataTable(id="preset-table", cursor_type="row", zebra_stripes=True)
            yield Static("Enter picks · Esc goes back · ★ what fits best", id="presets-help")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("", "Preset", "Card", "Context", "KV", "Memory", "Model set")
        best = self.table.best
        for item in self.table.plans:
            fits = not item.misfit
            table.add_row(
                "★" if best is not None and item is best else "",
                item.alias,
                f"{item.preset.vram_tier_gib} GB"
                if item.preset and item.preset.vram_tier_gib
                else "any",
                f"{item.plan.ctx:,}" if fits else f"no: {item.misfit}",
                item.plan.cache_type_k if fits else "",
                f"{item.plan.memory_bytes.total / GIB:.1f} GiB",
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


# --- dashboard ------------------------------------------------------------------------------------


def _rate(value: float | None, unit: str, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f} {unit}"


def vram_bar(prepared: Prepared, used_bytes: int | None, width: int) -> Text:
    """The planned split of the card (weights / KV / draft / other / free), scaled to width.

    The legend breaks between entries, never inside one.
    """
    memory = prepared.plan.memory_bytes
    other = memory.total - memory.weights - memory.kv - memory.draft
    free = max(prepared.available_bytes - memory.total, 0)
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
    legend = [(f"{label} {size / GIB:.1f}", colour) for size, label, colour in parts if size]
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
    bar.append(f"\nplan {memory.total / GIB:.2f} of {prepared.available_bytes / GIB:.1f} GiB")
    if used_bytes is not None:
        bar.append(f" · uses {used_bytes / GIB:.2f}")
    return bar


def per_cell(values: Sequence[float], width: int) -> list[float]:
    """The largest of the values each of ``width`` cells covers (a value may span cells)."""
    cells = []
    for cell in range(width):
        start = cell * len(values) // width
        end = max((cell + 1) * len(values) // width, start + 1)
        cells.append(max(values[start:end]))
    return cells


class Trend(Widget):
    """A one-line sparkline of the last minute, newest on the right, each cell the largest
    value of the samples it covers.

    Textual's Sparkline blends a new colour and style for every bar on every redraw, which
    made up most of the dashboard's cost each second; here the eight bar heights share eight
    styles, computed once per colour pair.
    """

    BARS = "▁▂▃▄▅▆▇█"
    COMPONENT_CLASSES: ClassVar[set[str]] = {"trend--low", "trend--high"}
    DEFAULT_CSS = """
    Trend { height: 1; }
    Trend > .trend--low { color: $primary 30%; }
    Trend > .trend--high { color: $primary; }
    """

    def __init__(self, id: str) -> None:
        super().__init__(id=id)
        self.values: tuple[float, ...] = ()
        self.level_styles: tuple[tuple[Color, Color], list[Style]] | None = None

    def show(self, values: Sequence[float]) -> None:
        if tuple(values) != self.values:
            self.values = tuple(values)
            self.refresh()

    def _styles(self) -> list[Style]:
        _, base = self.background_colors
        low = base + self.get_component_styles("trend--low").color
        high = base + self.get_component_styles("trend--high").color
        if self.level_styles is None or self.level_styles[0] != (low, high):
            levels = len(self.BARS) - 1
            styles = [
                Style(color=low.blend(high, level / levels).rich_color, bgcolor=base.rich_color)
                for level in range(levels + 1)
            ]
            self.level_styles = ((low, high), styles)
        return self.level_styles[1]

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if y or width <= 0:
            return Strip.blank(width, self.rich_style)
        values = self.values or (0.0,)
        low, high = min(values), max(values)
        cells = per_cell(values, width)
        extent = (high - low) or 1.0
        styles = self._styles()
        top = len(self.BARS) - 1
        levels = [int((value - low) / extent * top) for value in cells]
        segments = [Segment(self.BARS[level], styles[level]) for level in levels]
        return Strip(segments, width).simplify()


class ThroughputPanel(Vertical):
    def compose(self) -> ComposeResult:
        for key, title in (("decode", "decode"), ("prefill", "prefill"), ("ttft", "TTFT")):
            with Horizontal(classes="metric-row"):
                yield Label(title, classes="metric-name")
                yield Readout("—", id=f"{key}-value", classes="metric-value")
                yield Trend(id=f"{key}-spark")
        yield Readout("", id="spec-acceptance")

    def show_rates(self, history: deque[Sample], latest: Sample | None) -> None:
        shown = latest or Sample(0, None, None, None, None, None, None, None, None, 0)
        self.query_one("#decode-value", Readout).show(_rate(shown.decode_tokens_per_s, "tok/s"))
        self.query_one("#prefill-value", Readout).show(_rate(shown.prefill_tokens_per_s, "tok/s"))
        self.query_one("#ttft-value", Readout).show(_rate(shown.ttft_s, "s", 2))
        for key, field in (
            ("decode", "decode_tokens_per_s"),
            ("prefill", "prefill_tokens_per_s"),
            ("ttft", "ttft_s"),
        ):
            # A full-width window: an idle server's flat line stays equal and is not redrawn.
            points = [getattr(s, field) or 0.0 for s in history]
            padded = [0.0] * (SPARK_POINTS - len(points)) + points[-SPARK_POINTS:]
            self.query_one(f"#{key}-spark", Trend).show(padded)
        acceptance = self.query_one("#spec-acceptance", Readout)
        acceptance.display = shown.spec_acceptance is not None
        if shown.spec_acceptance is not None:
            acceptance.show(f"draft acceptance {shown.spec_acceptance:.0%}")


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
        self.query_one("#vram", Readout).show(vram_bar(prepared, used, width), layout=True)
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
            f"RAM {sample.engine_rss_bytes / GIB:.2f} GiB"
            if sample.engine_rss_bytes is not None
            else "",
            f"slots {sample.slots_busy or 0}/{sample.slots_total}"
            if sample.slots_total is not None
            else "",
        ]
        lines = [" · ".join(f for f in facts if f) for facts in (device, engine)]
        self.query_one("#gpu-live", Readout).show("\n".join(line for line in lines if line))


def log_style(line: str) -> Style:
    """Errors red, warnings yellow, lucebox's own lines (``#``) dim."""
    if LOG_ERROR.search(line):
        return Style(color="red", bold=True)
    if LOG_WARNING.search(line):
        return Style(color="yellow")
    return Style(dim=True) if line.startswith("#") else Style()


def log_line(line: str) -> Text:
    return Text(line, style=log_style(line))


class LogTail(Widget):
    """The engine log's newest lines that fit; the whole log is on the log screen (l).

    Drawn line by line: each log line is rendered to a strip once (per width) and reused as
    it moves up, so a busy engine log costs one new strip per new line.
    """

    KEPT_LINES = 200

    def __init__(self, id: str) -> None:
        super().__init__(id=id)
        self.lines: deque[str] = deque(maxlen=self.KEPT_LINES)
        self.strips: dict[tuple[int, int], Strip] = {}
        """Rendered lines by (line number, width), until the widget's style changes."""
        self.lines_added = 0

    def add(self, lines: list[str]) -> None:
        self.lines.extend(lines)
        self.lines_added += len(lines)
        first_kept = self.lines_added - len(self.lines)
        self.strips = {key: strip for key, strip in self.strips.items() if key[0] >= first_kept}
        self.refresh()  # same size, new text: no layout pass

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self.strips.clear()

    def render_line(self, y: int) -> Strip:
        width, height = self.size.width, self.size.height
        index = max(len(self.lines) - height, 0) + y
        if not 0 <= index < len(self.lines):
            return Strip.blank(width, self.rich_style)
        key = (self.lines_added - len(self.lines) + index, width)
        strip = self.strips.get(key)
        if strip is None:
            base = self.rich_style
            line = self.lines[index]
            text = Text(line)
            text.truncate(width, overflow="ellipsis")
            strip = Strip([Segment(text.plain, base + log_style(line))])
            strip = strip.extend_cell_length(width, base)
            self.strips[key] = strip
        return strip


class DashboardScreen(Screen[None]):
    """The served model at a glance: endpoint, throughput, memory, GPU, log; a chat to try it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("c", "toggle_chat", "Chat"),
        Binding("escape", "close_chat", "Close chat", show=False),
        Binding("r", "restart", "Restart"),
        Binding("s", "stop", "Stop"),
        Binding("p", "switch_preset", "Preset"),
        Binding("l", "open_log", "Log"),
        Binding("y", "copy_url", "Copy URL"),
        Binding("q", "quit_asking", "Quit"),
    ]

    def __init__(self, prepared: Prepared) -> None:
        super().__init__()
        self.prepared = prepared
        self.history: deque[Sample] = deque(maxlen=SPARK_POINTS)
        self.latest: Sample | None = None
        self.state = "ready"  # the dashboard opens when the server is ready
        self.restarts = 0
        self.log_lines_shown = 0
        self.log_shown_at = -LOG_TAIL_INTERVAL_S

    def compose(self) -> ComposeResult:
        yield Readout("", id="dash-header")
        with Horizontal(id="dash-top"):
            yield ThroughputPanel(id="throughput")
            yield GpuPanel(id="gpu")
        with Horizontal(id="dash-bottom"):
            yield LogTail(id="log-tail")
            yield ChatPanel(self.prepared, id="chat")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#throughput").border_title = "Throughput"
        self.query_one("#gpu").border_title = self.prepared.device
        self.query_one("#log-tail").border_title = f"Engine log · {self.prepared.engine_version}"
        self.query_one("#chat").display = False
        self.refresh_header()
        self.query_one(GpuPanel).show_gpu(self.prepared, None)
        self.query_one(LogTail).add([f"# lucebox: {note}" for note in self.app_.notes])

    @property
    def app_(self) -> LuceboxApp:
        assert isinstance(self.app, LuceboxApp)
        return self.app

    def refresh_header(self) -> None:
        plan = self.prepared.plan
        uptime_s = self.app_.clock() - self.app_.server_started_at
        state_style = {"ready": "green", "failed": "red", "stopped": "red"}.get(
            self.state, "yellow"
        )
        header = Text()
        header.append(self.prepared.model, style="bold cyan")
        header.append("  ")
        header.append(self.state, style=f"bold {state_style}")
        header.append(f" · up {format_duration(uptime_s)} · {self.restarts} restarts")
        header.append(f" · ctx {plan.ctx:,} · KV {plan.cache_type_k}\n")
        header.append(f"{url_of(self.prepared.spec)}/v1", style="bold underline")
        header.append("  y copies it", style="dim")
        self.query_one("#dash-header", Readout).show(header)

    def show_event(self, event: ServerEvent) -> None:
        self.state = service.state_of(event)
        self.restarts = event.restarts
        self.refresh_header()
        self.query_one(LogTail).add([f"# lucebox: {event.kind}: {event.message}"])

    def show_sample(self, sample: Sample) -> None:
        self.history.append(sample)
        self.latest = with_last_rates(self.latest, sample)
        self.query_one(ThroughputPanel).show_rates(self.history, self.latest)
        self.query_one(GpuPanel).show_gpu(self.prepared, sample)
        self.refresh_header()

    def show_log(self, supervisor: Supervisor, *, now: bool = False) -> None:
        """New engine log lines into the tail: at once with ``now``, else at most every
        LOG_TAIL_INTERVAL_S. A busy engine logs with every request, and moving the whole
        tail each second was the dashboard's largest cost while serving."""
        due_at = self.log_shown_at + LOG_TAIL_INTERVAL_S
        new_lines = min(supervisor.lines_total - self.log_lines_shown, len(supervisor.ring))
        if new_lines <= 0 or (not now and time.monotonic() < due_at):
            return
        self.log_lines_shown = supervisor.lines_total
        self.log_shown_at = time.monotonic()
        self.query_one(LogTail).add(list(supervisor.ring)[-new_lines:])

    def action_toggle_chat(self) -> None:
        chat = self.query_one(ChatPanel)
        chat.display = not chat.display
        if chat.display:
            chat.query_one(Input).focus()

    def action_close_chat(self) -> None:
        self.query_one(ChatPanel).display = False
        self.set_focus(None)

    def action_restart(self) -> None:
        self.app_.restart_server()

    def action_stop(self) -> None:
        self.app_.stop_server()

    def action_switch_preset(self) -> None:
        self.app_.pick_preset()

    def action_open_log(self) -> None:
        self.app.push_screen(LogScreen(self.app_.backend.log_path))

    def action_copy_url(self) -> None:
        url = f"{url_of(self.prepared.spec)}/v1"
        self.app.copy_to_clipboard(url)
        self.notify(f"copied {url}")

    def action_quit_asking(self) -> None:
        self.app.push_screen(QuitModal(), self.app_.quit_with)


def format_duration(seconds: float) -> str:
    """Minutes are enough for an uptime, and the header then changes once a minute."""
    minutes = max(int(seconds), 0) // 60
    if minutes < 60:
        return f"{minutes}m"
    return f"{minutes // 60}h{minutes % 60:02d}m"


class ChatPanel(Vertical):
    """Type a message, watch the reply stream in, with its time to first token and speed."""

    def __init__(self, prepared: Prepared, id: str) -> None:
        super().__init__(id=id)
        self.prepared = prepared
        self.messages: list[dict[str, str]] = []
        self.reply = ""

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="chat-scroll"):
            yield Static("", id="chat-transcript")
        yield Label("", id="chat-stats")
        yield Input(placeholder="Say something to the model, Enter sends", id="chat-input")

    def on_mount(self) -> None:
        self.border_title = "Chat"

    @on(Input.Submitted, "#chat-input")
    def send(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text:
            return
        event.input.value = ""
        self.messages.append({"role": "user", "content": text})
        self.reply = ""
        self.query_one("#chat-stats", Label).update("waiting for the first token…")
        self.render_transcript()
        self.stream_reply()

    def render_transcript(self) -> None:
        transcript = Text()
        for message in self.messages:
            if message["role"] == "user":
                transcript.append("you  ", style="bold cyan")
            else:
                transcript.append("model ", style="bold green")
            transcript.append(message["content"] + "\n")
        if self.reply:
            transcript.append("model ", style="bold green")
            transcript.append(self.reply)
        self.query_one("#chat-transcript", Static).update(transcript)
        self.query_one("#chat-scroll", VerticalScroll).scroll_end(animate=False)

    @work(exclusive=True, group="chat", exit_on_error=False)
    async def stream_reply(self) -> None:
        stats = self.query_one("#chat-stats", Label)
        spec = self.prepared.spec
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(300, connect=5)) as client:
                async for delta in stream_chat(
                    client, url_of(spec), list(self.messages), api_key=spec.api_key
                ):
                    if not self.reply and delta.text:
                        stats.update(f"TTFT {_rate(delta.ttft_s, 's', 2)} · streaming…")
                    self.reply += delta.text
                    if delta.done:
                        ttft = _rate(delta.ttft_s, "s", 2)
                        speed = _rate(delta.tokens_per_s, "tok/s")
                        stats.update(f"TTFT {ttft} · {speed}")
                    self.render_transcript()
        except ChatError as exc:
            stats.update(Text(str(exc), style="red"))
            return
        self.messages.append({"role": "assistant", "content": self.reply})
        self.reply = ""
        self.post_message(self.ReplyDone())

    @dataclass
    class ReplyDone(Message):
        """A reply finished streaming."""


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


# --- the app --------------------------------------------------------------------------------------


class LuceboxApp(App[int]):
    """`lucebox up`: runs the pipeline, then the dashboard of the served model."""

    CSS_PATH = "lucebox.tcss"
    TITLE = "lucebox"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True)
    ]

    def __init__(
        self,
        backend: Backend,
        options: ServeOptions,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self.backend = backend
        self.options = options
        self.clock = clock
        self.prepared: Prepared | None = None
        self.supervisor: Supervisor | None = None
        self.lock: service.ServeLock | None = None
        self.server_started_at = clock()
        self.exit_code = 0
        self.notes: list[str] = []
        """Notes of this pipeline run (warnings, an API key shown once), also in the log tail."""
        self.start_screen = StartScreen()
        self.dashboard: DashboardScreen | None = None

    async def on_mount(self) -> None:
        await self.push_screen(self.start_screen)
        if self.options.model is None and self.options.preset is None and self.backend.first_run():
            self.pick_preset()
        else:
            self.start_pipeline()

    # pipeline -----------------------------------------------------------------------------------

    def start_pipeline(self) -> None:
        self.start_screen.reset()
        self.prepare_pipeline()

    @work(thread=True, exclusive=True, group="pipeline", exit_on_error=False)
    def prepare_pipeline(self) -> None:
        worker = get_current_worker()
        current: list[StepName] = ["gpu"]

        def emit(event: StepEvent) -> None:
            current[0] = event.step
            if not worker.is_cancelled:
                self.post_message(StepChanged(event))

        try:
            if self.lock is None:
                self.lock = self.backend.lock()
            prepared = self.backend.prepare(self.options, emit)
        except LuceboxError as exc:
            self.post_message(PipelineFailed(current[0], exc.message, exc.hint))
            return
        self.post_message(PipelinePrepared(prepared))

    def on_step_changed(self, message: StepChanged) -> None:
        self.start_screen.show_step(message.event)

    def on_pipeline_failed(self, message: PipelineFailed) -> None:
        if self.screen is not self.start_screen:
            self.switch_screen(self.start_screen)
        self.start_screen.show_failure(message)

    def on_pipeline_prepared(self, message: PipelinePrepared) -> None:
        self.prepared = message.prepared
        self.start_screen.show_step(StepEvent("server", "running", "starting the engine"))
        self.run_server(message.prepared)

    @work(exclusive=True, group="server", exit_on_error=False)
    async def run_server(self, prepared: Prepared) -> None:
        supervisor = self.backend.supervisor(prepared)
        self.supervisor = supervisor
        async for item in self.backend.run(prepared, supervisor):
            if isinstance(item, ServerEvent):
                self.post_message(ServerChanged(item))
            else:
                self.post_message(MetricsSampled(item))

    async def on_server_changed(self, message: ServerChanged) -> None:
        event = message.event
        if event.kind == "ready":
            self.server_started_at = self.clock()
            if self.dashboard is None and self.prepared is not None:
                self.start_screen.show_step(StepEvent("server", "done", event.message))
                self.dashboard = DashboardScreen(self.prepared)
                await self.push_screen(self.dashboard)
        if event.kind == "gave-up":
            self.dashboard = None
            hint = "the log (l) has the engine's own words; Retry (r) starts it again"
            self.on_pipeline_failed(PipelineFailed("server", event.message, hint))
            return
        if self.dashboard is not None:
            self.dashboard.show_event(event)
            if self.supervisor is not None:
                self.dashboard.show_log(self.supervisor, now=True)
        else:
            self.start_screen.show_step(StepEvent("server", "running", event.message))

    def on_metrics_sampled(self, message: MetricsSampled) -> None:
        if self.dashboard is not None:
            self.dashboard.show_sample(message.sample)
            if self.supervisor is not None:
                self.dashboard.show_log(self.supervisor)

    # actions ------------------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="presets", exit_on_error=False)
    def pick_preset(self) -> None:
        """Plan every preset for this card (blocking: GPU probe, headers), then ask."""
        try:
            table = self.backend.preset_table(self.options)
        except LuceboxError as exc:
            self.post_message(PipelineFailed("preset", exc.message, exc.hint))
            return
        self.call_from_thread(self.push_screen, PresetScreen(table), self.preset_chosen)

    def preset_chosen(self, preset_id: str | None) -> None:
        if preset_id is None:
            # Leaving the first-run choice goes on with the preset lucebox picks itself.
            if self.prepared is None and not self.workers_in("pipeline"):
                self.start_pipeline()
            return
        self.backend.choose_preset(preset_id)
        self.options = replace(self.options, preset=preset_id, model=None)
        self.stop_server()
        self.dashboard = None
        self.prepared = None
        if self.screen is not self.start_screen:
            self.switch_screen(self.start_screen)
        self.start_pipeline()

    def restart_server(self) -> None:
        if self.supervisor is not None and self.prepared is not None:
            if self.workers_in("server"):
                self.supervisor.restart()
            else:
                self.run_server(self.prepared)

    def stop_server(self) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()

    def workers_in(self, group: str) -> bool:
        return any(w.group == group and not w.is_finished for w in self.workers)

    def quit_with(self, choice: str | None) -> None:
        if choice == "keep":
            self.keep_serving()
        elif choice == "stop":
            self.stop_and_exit()

    @work(exclusive=True, group="quit", exit_on_error=False)
    async def keep_serving(self) -> None:
        await self.shut_down()
        pid, log = self.backend.detach(self.options)
        self.exit(0, message=f"lucebox serves in the background (pid {pid}); log: {log}")

    @work(exclusive=True, group="quit", exit_on_error=False)
    async def stop_and_exit(self) -> None:
        await self.shut_down()
        self.exit(self.exit_code)

    async def shut_down(self) -> None:
        """Stop the engine and wait until it is gone; release the one-server lock."""
        self.stop_server()
        for worker in list(self.workers):
            if worker.group == "server":
                await worker.wait()
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def on_unmount(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    async def action_quit(self) -> None:
        self.stop_and_exit()


def make_app(paths: Paths, options: ServeOptions, backend: Backend | None = None) -> LuceboxApp:
    return LuceboxApp(backend or Backend(paths), options)
