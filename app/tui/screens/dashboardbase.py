"""What every dashboard does with the running server: its events and log, and the keys that
restart, stop, open the log, copy the address and quit. One model's dashboard and a served
set's are both one of these; each lists its own keys (the footer keeps their order)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from rich.text import Text
from textual.binding import Binding
from textual.screen import Screen

from lucebox.app.tui.messages import (
    KeysRequested,
    QuitRequested,
    RestartRequested,
    StopRequested,
)
from lucebox.app.tui.screens.log import LogScreen
from lucebox.app.tui.screens.quit import QuitModal
from lucebox.app.tui.widgets.log import LogTail
from lucebox.app.tui.widgets.readout import Readout
from lucebox.engine.run.death import EngineDeath
from lucebox.engine.run.serverrun.serverstatus import state_of
from lucebox.engine.run.supervision.serverevent import ServerEvent
from lucebox.engine.run.supervisor import Supervisor

LOG_TAIL_INTERVAL_S = 2.0
STATE_STYLES = {"ready": "green", "sleeping": "cyan", "failed": "red", "stopped": "red"}
"""The header's colour of a run's state; any other (starting, restarting) is yellow."""


def restarts_text(crashes: int, trials: int) -> str:
    """The engine's restarts after crashes, and lucebox's own trials apart from them."""
    text = f"{crashes} restart{'' if crashes == 1 else 's'}"
    return text + (f" · {trials} calibration trial{'' if trials == 1 else 's'}" if trials else "")


def format_duration(seconds: float) -> str:
    """Minutes are enough for an uptime, and the header then changes once a minute."""
    minutes = max(int(seconds), 0) // 60
    if minutes < 60:
        return f"{minutes}m"
    return f"{minutes // 60}h{minutes % 60:02d}m"


RESTART = Binding("r", "restart", "Restart")
STOP = Binding("s", "stop", "Stop")
OPEN_LOG = Binding("l", "open_log", "Log")
COPY_URL = Binding("y", "copy_url", "Copy URL")
QUIT = Binding("q", "quit_asking", "Quit")
KEYS = Binding("k", "open_keys", "Keys")
"""The keys every serving dashboard has (its actions are here); each screen orders its own."""


class ServingScreen(Screen[None]):
    """A dashboard of a running server, the served address ``url`` (without ``/v1``)."""

    def __init__(
        self, *, url: str, log_path: Path, notes: list[str], clock: Callable[[], float]
    ) -> None:
        super().__init__()
        self.url = url
        self.log_path = log_path
        self.notes = list(notes)
        self.clock = clock
        self.server_started_at = clock()  # the dashboard opens when the server is ready
        self.state = "ready"
        self.restarts = 0
        self.trials = 0
        """Restarts lucebox asked for itself (calibration trials): no crash."""
        self.cause: EngineDeath | None = None
        """Why the engine last died: shown under the state until it dies again."""
        self.log_lines_shown = 0
        self.log_shown_at = -LOG_TAIL_INTERVAL_S

    def refresh_header(self) -> None:
        raise NotImplementedError

    def show_header(self, header: Text) -> None:
        """The dashboard's header, with the engine's last death under it once it has died."""
        readout = self.query_one("#dash-header", Readout)
        readout.set_class(self.cause is not None, "with-cause")
        if self.cause is not None:
            style = "yellow" if self.state == "ready" else "red"
            header.append(f"\nlast exit: {self.cause.code}", style=f"bold {style}")
            header.append(f" · {self.cause.sentence}", style=style)
        readout.show(header)

    @property
    def state_style(self) -> str:
        return STATE_STYLES.get(self.state, "yellow")

    def show_event(self, event: ServerEvent) -> None:
        if event.kind in ("ready", "sleeping"):
            self.server_started_at = self.clock()  # the header says how long it has slept
        self.state = state_of(event)
        self.restarts = event.restarts
        if event.kind == "restarting" and event.planned:
            self.trials += 1
        self.cause = event.cause or self.cause
        self.refresh_header()
        self.query_one(LogTail).add([f"# lucebox: {event.kind}: {event.message}"])

    def show_note(self, note: str) -> None:
        """Something lucebox did while serving (a model planned again), in the log tail."""
        self.query_one(LogTail).add([f"# lucebox: {note}"])

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

    def action_restart(self) -> None:
        self.post_message(RestartRequested())

    def action_stop(self) -> None:
        self.post_message(StopRequested())

    def action_open_keys(self) -> None:
        self.post_message(KeysRequested())

    def action_open_log(self) -> None:
        self.app.push_screen(LogScreen(self.log_path))

    def action_copy_url(self) -> None:
        url = f"{self.url}/v1"
        self.app.copy_to_clipboard(url)
        self.notify(f"copied {url}")

    def action_quit_asking(self) -> None:
        self.app.push_screen(QuitModal(), self.quit_chosen)

    def quit_chosen(self, choice: str | None) -> None:
        if choice in ("keep", "stop"):
            self.post_message(QuitRequested(keep_serving=choice == "keep"))
