"""Crash logs keep the whole traceback where the user is told to look."""

from __future__ import annotations

import os

from lucebox.engine.core.crashlog import write_crash_log
from lucebox.engine.core.paths import resolve_paths


def failing() -> None:
    raise ValueError("the detail a bug report needs")


def raised() -> ValueError:
    try:
        failing()
    except ValueError as exc:
        return exc
    raise AssertionError("failing() returned")


def test_the_traceback_lands_in_the_logs_folder(lucebox_home):
    paths = resolve_paths(dict(os.environ))
    log = write_crash_log(paths, raised())
    assert log.parent == paths.logs_dir
    text = log.read_text()
    assert "Traceback" in text and "in failing" in text
    assert text.rstrip().endswith("ValueError: the detail a bug report needs")


def test_without_a_usable_logs_folder_it_goes_to_a_temp_file(lucebox_home):
    lucebox_home.mkdir(parents=True)
    paths = resolve_paths(dict(os.environ))
    paths.logs_dir.parent.mkdir(parents=True, exist_ok=True)
    paths.logs_dir.write_text("a file where the folder should be")
    log = write_crash_log(paths, raised())
    try:
        assert not log.is_relative_to(lucebox_home)
        assert "ValueError: the detail a bug report needs" in log.read_text()
    finally:
        log.unlink()
