"""How lucebox runs itself in another process: the detached server, systemd units, benches."""

from __future__ import annotations

import sys

CLI_MODULE = "lucebox.app.cli"
"""The module ``python -m`` runs as ``lucebox`` (the console script's own code)."""


def cli_argv(*args: str, python: str = sys.executable) -> list[str]:
    """``lucebox ARGS`` through ``python``, the interpreter that has lucebox installed."""
    return [python, "-m", CLI_MODULE, *args]
