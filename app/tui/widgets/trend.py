"""A one-line sparkline that costs little to redraw every second."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual.color import Color
from textual.strip import Strip
from textual.widget import Widget


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
