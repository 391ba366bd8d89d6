"""Crash logs: the full traceback of an unexpected error, kept in a file the user is shown."""

from __future__ import annotations

import contextlib
import tempfile
import time
import traceback
from pathlib import Path

from lucebox.engine.core.errors import LuceboxError
from lucebox.engine.core.paths import Paths


def write_crash_log(paths: Paths | None, error: BaseException) -> Path:
    """Write ``error``'s traceback to the logs folder (a temp file if that fails); its path."""
    text = "".join(traceback.format_exception(error))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if paths is not None:
        with contextlib.suppress(OSError, LuceboxError):
            target = paths.ensure(paths.logs_dir) / f"crash-{stamp}.log"
            target.write_text(text, encoding="utf-8")
            return target
    fd, name = tempfile.mkstemp(prefix=f"lucebox-crash-{stamp}-", suffix=".log")
    with open(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    return Path(name)
