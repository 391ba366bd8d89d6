"""The bench's own server calibrating between turns, as ``lucebox serve`` does once idle.

``bench replay --between calibrate`` restarts its server with the launch's speculation
unmeasured and a short idle wait (:data:`CALIBRATE_IDLE_S`, layered over config.toml through
:data:`~lucebox.engine.machine.config.SETTINGS_ENV`, the file never changed), so the speculation
calibration of :mod:`lucebox.engine.run.calibrate.calibrator` starts: its trials restart the
engine and its probes run on it. The next turn is sent once the calibration is done and the
planned launch serves again, so it measures what of the client's conversation survived
lucebox's own work.

The user's measurement store is kept aside whole (:class:`MeasurementsAside`) and put back
when the bench's server stops, whatever ended it; in between only its speculation entries are
emptied, so the store's other sections (prefill rates, engine verdicts) plan the launch as
before.
"""

from __future__ import annotations

import os
import shutil
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import psutil
import tomli_w

from lucebox.engine.core.errors import RunError, UsageError
from lucebox.engine.core.paths import Paths
from lucebox.engine.machine.config import SETTINGS_ENV
from lucebox.engine.pipeline import Emit, ServeOptions, prepare
from lucebox.engine.plan.speculation.measurements import read_section, store_file, write_section
from lucebox.engine.run.calibrate.calibrator import setup_for
from lucebox.engine.run.runstate import Status, current_status, state_file

CALIBRATE_IDLE_S = 2.0
"""How long the bench's server waits idle before it calibrates: the bench sends nothing while it
waits, so a short wait is as idle as the user's 30 s and only makes each turn's wait shorter."""
CALIBRATED_TIMEOUT_S = 1800.0
"""A calibration measures every configuration the launch allows: minutes on a GPU."""
SPEC_SECTION = "entries"
"""The store's section of speculation measurements (the other sections are left as they are)."""


def refuse_without_calibration(paths: Paths, options: ServeOptions, emit: Emit) -> None:
    """Refuse before any server starts when the launch gives the calibration nothing to measure.

    Prepared as ``serve`` prepares it (files fetched, engine built), so the question is the one
    ``serve`` asks (:func:`~lucebox.engine.run.calibrate.calibrator.setup_for`): a wait on a
    calibration that never starts would otherwise end only at its timeout.
    """
    prepared = prepare(paths, options, emit)
    launch = prepared.launch
    settings = replace(prepared.settings, calibrate_idle_s=CALIBRATE_IDLE_S)
    if setup_for(launch, settings, lambda trial: None, lambda: None) is not None:
        return
    if launch.resolved.spec == "off":
        why = "speculation is off for it (model.spec = off in config.toml)"
        hint = "serve it with speculation (`lucebox config set model.spec auto`)"
    else:
        why = f"it has no speculation to measure here ({launch.speculation.reason})"
        hint = "name a draft with --draft, or serve a model with an MTP head"
    raise UsageError(
        f"--between calibrate: {launch.title} would not calibrate: {why}",
        hint=f"{hint}; or measure restarts alone with --between restart",
    )


def calibrating_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with :data:`CALIBRATE_IDLE_S` layered over its own settings layer, if any."""
    layer = tomllib.loads(env.get(SETTINGS_ENV, ""))
    layer.setdefault("spec", {})["calibrate_idle_s"] = CALIBRATE_IDLE_S
    return {**env, SETTINGS_ENV: tomli_w.dumps(layer)}


class MeasurementsAside:
    """The user's measurement store kept whole (a copy beside it) while the bench's server
    calibrates, and put back once it stops.

    A copy, not a move: should the bench be killed before :meth:`put_back`, the user's
    measurements are still in ``spec-measurements.json.bench-<pid>`` beside the store, and the
    next bench that keeps them aside puts that copy back first (:func:`put_back_left_aside`).
    """

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        self.store = store_file(paths)
        self.aside: Path | None = None
        if self.store.exists():
            self.aside = self.store.with_name(f"{self.store.name}.bench-{os.getpid()}")
            shutil.copy2(self.store, self.aside)

    def forget_speculation(self) -> None:
        """No speculation measured: the next start of the launch calibrates once idle."""
        write_section(self.paths, SPEC_SECTION, {})

    def put_back(self) -> None:
        """The store as it was before the first calibration (none if there was none)."""
        if self.aside is None:
            self.store.unlink(missing_ok=True)
        else:
            os.replace(self.aside, self.store)


def put_back_left_aside(paths: Paths) -> Path | None:
    """The user's store put back from the copy a killed bench left beside it (the copy of a
    bench still running is left alone); the copy put back, None when there was none.

    The newest copy wins: an older one predates measurements the user made since."""
    store = store_file(paths)
    left = [
        aside
        for aside in store.parent.glob(f"{store.name}.bench-*")
        if not _bench_alive(aside.name.rpartition("-")[2])
    ]
    if not left:
        return None
    newest = max(left, key=lambda aside: aside.stat().st_mtime_ns)
    os.replace(newest, store)
    for older in left:
        older.unlink(missing_ok=True)
    return newest


def _bench_alive(pid_text: str) -> bool:
    return pid_text.isdigit() and int(pid_text) != os.getpid() and psutil.pid_exists(int(pid_text))


def wait_calibrated(
    paths: Paths, pid: int, alive: Callable[[], bool], log: Path, timeout_s: float
) -> str:
    """Wait until the calibration of the server ``pid`` is done and its planned launch serves
    again (ready, after the restart into what the calibration chose); what it chose."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive() or current_status(paths).state == "failed":
            raise RunError("lucebox serve stopped while it calibrated", hint=f"its log is {log}")
        if calibrated(paths, pid):
            return verdict(paths)
        time.sleep(0.25)
    raise RunError(
        f"the calibration was not done within {timeout_s:.0f} s",
        hint=f"`lucebox status` of the bench's server said why; its log is {log}",
    )


def calibrated(paths: Paths, pid: int) -> bool:
    """Whether the server ``pid`` has stored a measurement and a status written after the last
    one shows it ready and measuring nothing.

    The calibration writes its verdict and asks for the restart into its choice in one step, so
    the first status written after the store's last write already says "restarting" when that
    restart comes; a ready one before it cannot pass for the end.
    """
    try:
        measured_ns = store_file(paths).stat().st_mtime_ns
        status_ns = state_file(paths).stat().st_mtime_ns
    except OSError:
        return False
    status = current_status(paths)
    if status.pid != pid or status.state != "ready" or status_ns <= measured_ns:
        return False
    return bool(read_section(paths, SPEC_SECTION)) and not measuring(status)


def measuring(status: Status) -> bool:
    """Whether ``status`` shows a calibration measuring (or paused for a client)."""
    reason = status.spec.reason if status.spec is not None else ""
    return reason.startswith(("measuring", "re-measuring"))


def verdict(paths: Paths) -> str:
    """What the calibration chose (``ngram-mod``, ``off``), or that it kept the forced mode."""
    entries = read_section(paths, SPEC_SECTION).values()
    chosen = [str(e["chosen"]) for e in entries if isinstance(e, dict) and e.get("chosen")]
    return ", ".join(chosen) or "the mode asked for, measured"
