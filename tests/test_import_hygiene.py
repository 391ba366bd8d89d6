"""The engine stays headless: importing any of its modules loads no TUI library."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import lucebox.engine


def engine_modules() -> list[str]:
    return [f"lucebox.engine.{info.name}" for info in pkgutil.iter_modules(lucebox.engine.__path__)]


def test_engine_modules_import_no_textual_or_rich():
    modules = engine_modules()
    assert "lucebox.engine.gpu" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'textual', 'rich'}"
        " or m.startswith('lucebox.app'))\n"
        "print(','.join(bad))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""
