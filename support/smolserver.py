"""A lucebox home of its own that uses the built CPU engine, for tests that serve SmolLM2.

The shared engine home's one-server lock and state file stay free for the tests that use it;
the engine itself is not copied: its manifest points at the built binary.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.machine import config
from support.realmodels import engine_home


def private_engine_home(folder: Path) -> Path:
    """``folder`` as a LUCEBOX_HOME that knows the engines built in the shared engine home."""
    source = resolve_paths({"LUCEBOX_HOME": str(engine_home())}).engines_dir
    target = resolve_paths({"LUCEBOX_HOME": str(folder)}).engines_dir
    for manifest in source.glob("*/manifest.json"):
        (target / manifest.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(manifest, target / manifest.parent.name / manifest.name)
    no_calibration(folder)
    return folder


def no_calibration(home: Path) -> None:
    """A test home serves as planned: no speculation calibration restarts a server mid-test
    (the calibration's own tests turn it on), and a server off loopback announces nothing on
    the real network (the LAN tests announce inside a network namespace of their own)."""
    paths = resolve_paths({"LUCEBOX_HOME": str(home)})
    config.set_setting(paths, "spec.calibrate_idle_s", "0")
    config.set_setting(paths, "server.mdns_name", "")
