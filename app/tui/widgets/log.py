"""Engine log lines: styled by level, and the dashboard's tail of the newest ones."""

from __future__ import annotations

import re
from collections import deque

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.strip import Strip
from textual.widget import Widget

# The engine's level letter follows its timestamp ("0.01.234.567 W srv ..."); see the contract.
LOG_ERROR = re.compile(r"(?i:\berror\b|\bfailed\b)|^(?:[\d.]+ )?E ")
LOG_WARNING = re.compile(r"(?i:\bwarn(ing)?\b)|^(?:[\d.]+ )?W ")


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
