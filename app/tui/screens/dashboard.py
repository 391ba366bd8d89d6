"""The served model at a glance: endpoint, throughput, memory, GPU, log, and a chat."""

from __future__ import annotations

import os
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.widgets import Footer, Input

from lucebox.app.tui.messages import PresetPickRequested, SleepPickRequested, UsersPickRequested
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
from lucebox.app.tui.widgets.chat import ChatPanel
from lucebox.app.tui.widgets.gpu import GpuPanel
from lucebox.app.tui.widgets.log import LogTail
from lucebox.app.tui.widgets.readout import Readout
from lucebox.app.tui.widgets.throughput import SPARK_POINTS, ThroughputPanel
from lucebox.engine.engines import webui
from lucebox.engine.pipeline import Prepared
from lucebox.engine.plan.launch import url_of
from lucebox.engine.plan.lucebox.kvmodeview import ModesStatus
from lucebox.engine.run.kinds.metrics import Sample, with_last_rates
from lucebox.engine.run.sample import EngineStatus, QueueStatus, SpecStatus
from lucebox.engine.run.supervision.serverevent import ServerEvent


class DashboardScreen(ServingScreen):
    """The served model at a glance: endpoint, throughput, memory, GPU, log; a chat to try it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("c", "toggle_chat", "Chat"),
        Binding("escape", "close_chat", "Close chat", show=False),
        RESTART,
        STOP,
        Binding("p", "switch_preset", "Preset"),
        OPEN_LOG,
        COPY_URL,
        Binding("w", "open_webui", "Web UI"),
        KEYS,
        QUIT,
        # Last: a narrow footer drops these, not Quit.
        Binding("u", "choose_users", "Users"),
        Binding("z", "choose_sleep", "Sleep"),
    ]

    def __init__(
        self,
        prepared: Prepared,
        *,
        log_path: Path,
        notes: list[str],
        clock: Callable[[], float],
        webui_url: str | None = None,
    ) -> None:
        url = url_of(prepared.server)
        super().__init__(url=url, log_path=log_path, notes=notes, clock=clock)
        self.prepared = prepared
        self.history: deque[Sample] = deque(maxlen=SPARK_POINTS)
        self.latest: Sample | None = None
        self.served_ctx: int | None = None
        """The context the running engine serves: after an out-of-memory re-plan, the new one."""
        self.engine: EngineStatus | None = None
        """The engine kind serving and what chose it, as the run last said."""
        self.webui_url = webui_url
        """The chat page, the engine's own or the one lucebox's front serves."""

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
        self.query_one(LogTail).add([f"# lucebox: {note}" for note in self.notes])

    def refresh_header(self) -> None:
        plan = self.prepared.plan
        uptime_s = self.clock() - self.server_started_at
        header = Text()
        header.append(self.prepared.model, style="bold cyan")
        header.append("  ")
        header.append(self.state, style=f"bold {self.state_style}")
        awake = "for" if self.state == "sleeping" else "up"
        header.append(f" · {awake} {format_duration(uptime_s)} · ")
        header.append(restarts_text(self.restarts, self.trials))
        header.append(f" · ctx {self.served_ctx or plan.ctx:,} · KV {plan.cache_type_k}")
        header.append(" · vision" if self.prepared.launch.vision.served else "")
        if self.engine is not None:
            header.append(f" · {self.engine.text()}")
        header.append("\n")
        header.append(f"{self.url}/v1", style="bold underline")
        header.append("  y copies it", style="dim")
        if self.webui_url:
            header.append("   chat in a browser ")
            header.append(self.webui_url, style="bold underline")
            header.append("  w opens it", style="dim")
        self.show_header(header)

    def show_event(self, event: ServerEvent) -> None:
        if event.ctx is not None:
            self.served_ctx = event.ctx
        super().show_event(event)

    def show_sample(
        self,
        sample: Sample,
        spec: SpecStatus | None = None,
        queue: QueueStatus | None = None,
        kv_modes: ModesStatus | None = None,
        engine: EngineStatus | None = None,
    ) -> None:
        self.engine = engine
        self.history.append(sample)
        self.latest = with_last_rates(self.latest, sample)
        self.query_one(ThroughputPanel).show_rates(self.history, self.latest, spec, queue, kv_modes)
        self.query_one(GpuPanel).show_gpu(self.prepared, sample)
        self.refresh_header()

    def action_toggle_chat(self) -> None:
        chat = self.query_one(ChatPanel)
        chat.display = not chat.display
        if chat.display:
            chat.query_one(Input).focus()

    def action_close_chat(self) -> None:
        self.query_one(ChatPanel).display = False
        self.set_focus(None)

    def action_switch_preset(self) -> None:
        self.post_message(PresetPickRequested())

    def action_choose_users(self) -> None:
        self.post_message(UsersPickRequested())

    def action_choose_sleep(self) -> None:
        self.post_message(SleepPickRequested())

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # An engine built without the UI has no page to open: no key in the footer.
        return action != "open_webui" or self.webui_url is not None

    def action_open_webui(self) -> None:
        if self.webui_url is None:
            return
        if webui.has_desktop(os.environ, sys.platform):
            self.app.open_url(self.webui_url)
            self.notify(f"opening {self.webui_url} in the browser")
        else:
            self.app.copy_to_clipboard(self.webui_url)
            self.notify(f"no desktop here: open {self.webui_url} in a browser (copied)")
