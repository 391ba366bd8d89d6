"""Run state: the state file and its typed status, the one-server lock, stopping a server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import replace

import pytest

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.run import gpustatus, runstate
from lucebox.engine.run.death import EngineDeath
from lucebox.engine.run.sample import (
    CacheStatus,
    EngineStatus,
    GpuStatus,
    MeasuredRate,
    PeerStatus,
    Sample,
    SpecStatus,
)


def a_sample(at_s: float = 1700000000.0, decode: float | None = 88.5) -> Sample:
    return Sample(at_s, decode, 240.0, 0.05, 0.8, None, None, 12.0, 2**28, 1)


SEGFAULT = EngineDeath(
    "segfault",
    "the engine crashed (SIGSEGV), after: srv  update_slots: all slots are idle",
    "report it with the log's last lines (`lucebox logs`); another preset may avoid it",
    -11,
    ("srv  update_slots: all slots are idle",),
)


def serving(pid: int, sample: Sample | None = None) -> runstate.Status:
    return runstate.Status(
        "ready",
        pid=pid,
        url="http://127.0.0.1:8080",
        model="smoke",
        started_at=1700000000.0,
        restarts=1,
        planned_restarts=2,
        engine_pid=pid,
        ctx=4096,
        sample=sample,
        spec=SpecStatus("draft-simple", True, "as planned", 0.9, 2.7),
        cache=CacheStatus(0.4, 0, 24, 12),
        gpus=(GpuStatus(0, 2**33, 2**34, 40), GpuStatus(1, 2**32, 2**34, None)),
        peers=(PeerStatus("10.0.0.2:50052", "0.6.0-dev (build 11434)", 2**34, "up"),),
        cause=SEGFAULT,
        engine=EngineStatus(
            "lucebox", "measured", "the Lucebox engine is faster, measured on this card"
        ),
    )


def test_status_json_keeps_the_design_keys():
    document = serving(os.getpid(), a_sample()).to_json(now_s=1700000010.0)
    assert {"state", "pid", "url", "model", "uptime_s", "restarts", "sample", "spec", "cache"} <= (
        document.keys()
    )
    assert document["uptime_s"] == 10.0
    assert {
        "decode_tokens_per_s",
        "prefill_tokens_per_s",
        "ttft_s",
        "spec_acceptance",
        "vram_used_bytes",
        "gpu_util_percent",
    } <= document["sample"].keys()
    assert document["spec"] == {
        "type": "draft-simple",
        "active": True,
        "reason": "as planned",
        "acceptance": 0.9,
        "accepted_per_step": 2.7,
        "measured": None,
        "by_sampling": [],
    }

    assert {"cached_prompt_share", "full_reprocess_events"} <= document["cache"].keys()
    assert document["gpus"][0] == {
        "index": 0,
        "vram_used_bytes": 2**33,
        "vram_total_bytes": 2**34,
        "util_percent": 40,
    }
    assert document["peers"] == [
        {
            "address": "10.0.0.2:50052",
            "build": "0.6.0-dev (build 11434)",
            "free_bytes": 2**34,
            "state": "up",
        }
    ]
    assert document["cause"] == {
        "code": "segfault",
        "words": SEGFAULT.words,
        "next_step": SEGFAULT.next_step,
        "returncode": -11,
        "last_lines": ["srv  update_slots: all slots are idle"],
    }
    stopped = runstate.STOPPED.to_json()
    assert (stopped["state"], stopped["pid"], stopped["sample"], stopped["spec"]) == (
        "stopped",
        None,
        None,
        None,
    )
    assert stopped["cause"] is None


def test_the_measured_rate_of_speculation_reaches_status_and_reads_back():
    measured = MeasuredRate(690.0, 1100.0, 1.594, 4, 1700000000.0)
    spec = SpecStatus("draft-mtp", True, "measured", 1.0, 2.99, measured)
    document = runstate.Status("ready", spec=spec).to_file_json()
    assert document["spec"]["measured"] == {
        "baseline_tok_s": 690.0,
        "tok_s": 1100.0,
        "ratio": 1.594,
        "probes": 4,
        "at": 1700000000.0,
    }
    back = runstate.Status.from_file_json(json.loads(json.dumps(document)))
    assert back is not None and back.spec == spec


def test_state_file_round_trip_and_a_dead_server_reads_as_stopped(tmp_path):
    paths = resolve_paths()
    status = serving(os.getpid(), a_sample())
    runstate.write_status(paths, status)
    assert runstate.read_status(paths) == status
    two_cards = serving(os.getpid(), replace(a_sample(), gpu_loads=((0, 2**30, 40), (1, None, 7))))
    runstate.write_status(paths, two_cards)
    assert runstate.read_status(paths) == two_cards
    runstate.write_status(paths, status)
    assert runstate.current_status(paths) == status
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    runstate.write_status(paths, serving(int(done.stdout)))
    assert runstate.current_status(paths) is runstate.STOPPED
    runstate.state_file(paths).write_text('{"state": "ready", "pid": ')
    assert runstate.current_status(paths) is runstate.STOPPED
    runstate.state_file(paths).write_text(json.dumps({"state": "dancing", "pid": os.getpid()}))
    assert runstate.current_status(paths) is runstate.STOPPED


def test_a_second_server_is_refused_by_name():
    paths = resolve_paths()
    lock = runstate.ServeLock(paths)
    try:
        runstate.write_status(paths, serving(os.getpid()))
        with pytest.raises(runstate.AlreadyServingError, match="already serves smoke at http"):
            runstate.ServeLock(paths)
    finally:
        lock.release()
    runstate.ServeLock(paths).release()


def test_a_server_still_stopping_is_waited_for_not_named_as_none():
    """The server before has removed its status but still holds the lock while it stops: the
    next one waits for it instead of saying "already serves None at None"."""
    paths = resolve_paths()
    stopping = runstate.ServeLock(paths)
    releaser = threading.Timer(0.5, stopping.release)
    releaser.start()
    try:
        started_s = time.monotonic()
        runstate.ServeLock(paths).release()  # no status: it waits until the lock is free
        assert 0.3 < time.monotonic() - started_s < 10
    finally:
        releaser.join()


def test_stop_server_stops_the_recorded_process():
    paths = resolve_paths()
    assert runstate.stop_server(paths) is None
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    # This test is the parent: reap the child as soon as it ends, as init would.
    reaper = threading.Thread(target=server.wait)
    reaper.start()
    runstate.write_status(paths, serving(server.pid))
    lock = runstate.ServeLock(paths)  # a running server holds it
    try:
        assert runstate.stop_server(paths, timeout_s=10) == server.pid
    finally:
        lock.release()
    reaper.join(timeout=5)
    assert server.returncode == -15


def test_a_state_file_left_by_a_killed_lucebox_is_not_trusted():
    paths = resolve_paths()
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # The state file names a live pid, but no server holds the lock: the pid was reused.
        runstate.write_status(paths, serving(bystander.pid))
        assert runstate.stop_server(paths, timeout_s=2) is None
        assert bystander.poll() is None
        assert not runstate.state_file(paths).exists()
    finally:
        bystander.kill()
        bystander.wait()


def test_every_gpu_is_read_for_status():
    from tests.engine.fake_nvml import FakeGpu, FakeNvml

    nvml = FakeNvml(
        gpus=[
            FakeGpu(used_bytes=2**30),
            FakeGpu(used_bytes=2**31, unsupported=frozenset({"utilization_percent"})),
        ]
    )
    found = gpustatus.gpu_statuses(nvml)
    assert [(g.index, g.vram_used_bytes) for g in found] == [(0, 2**30), (1, 2**31)]
    assert found[1].util_percent is None
