"""The bench's server calibrating between turns: the user's store kept and put back, the
settings layer, and when a calibration counts as done (from the files a serve writes)."""

from __future__ import annotations

import os
import tomllib

import pytest

from lucebox.engine.bench.recalibration import (
    MeasurementsAside,
    calibrated,
    calibrating_env,
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
