"""The desktop launcher: ``assets/lucebox.desktop`` with the Exec line of this install (pure).

The shipped entry runs ``lucebox up`` from PATH; the installed one names the interpreter that
has lucebox, so the menu entry works for a venv or pipx install too.
"""

from __future__ import annotations

import re

DESKTOP_NAME = "lucebox.desktop"
ICON_NAME = "lucebox.svg"

_PLAIN = re.compile(r"[A-Za-z0-9_./:=+,@-]+")


def quote_exec_arg(arg: str) -> str:
    """One argument of a desktop entry's Exec key (Desktop Entry Specification, "Exec key")."""
    if _PLAIN.fullmatch(arg):
        return arg
    inner = re.sub(r'(["`$\\])', r"\\\1", arg)
    # The value is a string too: its backslashes are escaped once more, and % is a field code.
    return f'"{inner}"'.replace("\\", "\\\\").replace("%", "%%")


def shipped_entry() -> str:
    from importlib import resources  # on use: `lucebox status` imports this module

    return (resources.files("lucebox.assets") / DESKTOP_NAME).read_text(encoding="utf-8")


def icon_bytes() -> bytes:
    from importlib import resources  # on use: `lucebox status` imports this module

    return (resources.files("lucebox.assets") / ICON_NAME).read_bytes()


def render_entry(up_argv: tuple[str, ...]) -> str:
    """The shipped entry with ``Exec`` (and ``TryExec``) set to ``up_argv``."""
    exec_line = "Exec=" + " ".join(quote_exec_arg(a) for a in up_argv)
    lines = []
    for line in shipped_entry().splitlines():
        if line.startswith("Exec="):
            lines += ["TryExec=" + up_argv[0].replace("\\", "\\\\"), exec_line]
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"
