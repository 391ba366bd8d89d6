"""The bench's server calibrating between turns: the user's store kept and put back, the
settings layer, and when a calibration counts as done (from the files a serve writes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tomllib

import pytest

from lucebox.engine.bench.recalibration import (
    MeasurementsAside,
    calibrated,
    calibrating_env,
    put_back_left_aside,
)
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.machine.config import SETTINGS_ENV
from lucebox.engine.plan.speculation.measurements import read_section, store_file, write_section
from lucebox.engine.run.runstate import Status, state_file, write_status
from lucebox.engine.run.sample import SpecStatus


@pytest.fixture
def paths():
    return resolve_paths()


def test_the_users_store_is_put_back_whole_after_the_benchs_verdicts(paths):
    write_section(paths, "entries", {"users": {"chosen": "ngram-mod"}})
    write_section(paths, "prefill", {"rate": 1})
    users = store_file(paths).read_bytes()
    aside = MeasurementsAside(paths)
    aside.forget_speculation()
    # Only the speculation is unmeasured: the other sections plan the launch as before.
    assert read_section(paths, "entries") == {} and read_section(paths, "prefill") == {"rate": 1}
    write_section(paths, "entries", {"bench": {"chosen": "off"}})
    aside.put_back()
    assert store_file(paths).read_bytes() == users
    assert [p.name for p in store_file(paths).parent.iterdir()] == [store_file(paths).name]


KILLED_BENCH = """
import os, signal
from lucebox.engine.bench.recalibration import MeasurementsAside
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.plan.speculation.measurements import write_section
paths = resolve_paths()
MeasurementsAside(paths).forget_speculation()
write_section(paths, "entries", {"bench": {"chosen": "off"}})
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_benchs_copy_is_put_back_and_a_running_ones_left(paths):
    write_section(paths, "entries", {"users": {"chosen": "ngram-mod"}})
    users = store_file(paths).read_bytes()
    killed = subprocess.run([sys.executable, "-c", KILLED_BENCH], check=False)
    assert killed.returncode == -signal.SIGKILL
    assert read_section(paths, "entries") == {"bench": {"chosen": "off"}}
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as running:
        try:
            running_copy = store_file(paths).with_name(
                f"{store_file(paths).name}.bench-{running.pid}"
            )
            running_copy.write_text("{}")
            put_back = put_back_left_aside(paths)
            assert put_back not in (None, running_copy) and not put_back.exists()
            assert store_file(paths).read_bytes() == users
            assert running_copy.exists()
            assert put_back_left_aside(paths) is None
        finally:
            running.kill()


def test_no_store_before_means_none_after(paths):
    aside = MeasurementsAside(paths)
    aside.forget_speculation()
    aside.put_back()
    assert not store_file(paths).exists()


def test_the_idle_wait_is_layered_over_the_users_own_layer():
    env = calibrating_env({"PATH": "/bin", SETTINGS_ENV: "spec.probe_max_tokens = 16"})
    layer = tomllib.loads(env[SETTINGS_ENV])
    assert layer == {"spec": {"probe_max_tokens": 16, "calibrate_idle_s": 2.0}}
    assert env["PATH"] == "/bin"


def spec(reason: str) -> SpecStatus:
    return SpecStatus("ngram-mod", True, reason, None, None)


def test_done_once_a_status_written_after_the_last_measurement_shows_it_ready(paths):
    ready = Status("ready", pid=os.getpid(), spec=spec("measured on this card"))
    write_status(paths, ready)
    assert not calibrated(paths, os.getpid())  # nothing measured yet
    write_section(paths, "entries", {"k": {"chosen": "ngram-mod"}})
    os.utime(state_file(paths), ns=(1, 1))
    assert not calibrated(paths, os.getpid())  # that status is older than the verdict
    write_status(paths, Status("ready", pid=os.getpid(), spec=spec("measuring on this card")))
    assert not calibrated(paths, os.getpid())
    write_status(paths, Status("restarting", pid=os.getpid(), spec=spec("measured")))
    assert not calibrated(paths, os.getpid())
    write_status(paths, ready)
    assert calibrated(paths, os.getpid())
    assert not calibrated(paths, os.getpid() + 1)  # another server's
