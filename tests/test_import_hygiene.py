"""The engine stays headless: its modules import without Textual, Rich or the front end.

httpx loads Rich for its optional command line when Rich is installed, so the run-time check
blocks Rich and Textual outright and requires every engine module to import anyway; the
import-linter contract in pyproject.toml checks our own imports statically.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import lucebox.engine


def engine_modules() -> list[str]:
    found = pkgutil.walk_packages(lucebox.engine.__path__, prefix="lucebox.engine.")
    return [info.name for info in found if not info.ispkg]


def test_engine_modules_import_without_textual_or_rich():
    modules = engine_modules()
    assert "lucebox.engine.machine.gpu" in modules
    code = (
        "import importlib, sys\n"
        "for blocked in ('textual', 'rich'):\n"
        "    sys.modules[blocked] = None  # any import of it now raises ImportError\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(','.join(sorted(m for m in sys.modules if m.startswith('lucebox.app'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
