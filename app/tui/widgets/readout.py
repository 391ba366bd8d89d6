"""A label that redraws only on change, and the text of a value that may be missing."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Label


class Readout(Label):
    """A label redrawn only when its text changes, so a dashboard at rest costs next to nothing.

    Its size is fixed by CSS, so a change needs no layout pass, unless ``layout`` says the text
    may take a different number of lines.
    """

    def show(self, content: Text | str, layout: bool = False) -> None:
        if content != getattr(self, "shown", None):
            self.shown = content
            self.update(content, layout=layout)


def value_text(value: float | None, unit: str, digits: int = 1) -> str:
    """A measured value with its unit, or a dash while there is none."""
    return "—" if value is None else f"{value:,.{digits}f} {unit}"
