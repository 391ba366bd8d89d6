"""`lucebox status` from the run-state file: cheap to ask, and `--watch` streams a line per sample.

The server side of the state file is :func:`runstate.write_status`, the function a running
server writes it with; this test process stands in as the live server (its pid is alive).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.run import runstate
from tests.engine.run.test_runstate import a_sample, serving

HEAVY = ("asyncio", "httpx", "psutil", "textual", "rich", "gguf", "huggingface_hub", "numpy")


def lucebox(*args: str) -> list[str]:
    """The `lucebox` console script's entry, as a subprocess."""
    return [sys.executable, "-m", "lucebox.app.entry", *args]


def test_status_json_reads_the_state_file_without_heavy_imports():
    paths = resolve_paths()
    runstate.write_status(paths, serving(os.getpid(), a_sample()))
    code = (
        "import sys\n"
        "from lucebox.app.entry import main\n"
        "code = main(['status', '--json'])\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "planner = [m for m in sys.modules if m.startswith('lucebox.engine.plan.')]\n"
        "print(sorted(heavy + planner), file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    # The long-context modes' status values (and their package's map) are all of the planner
    # it reads.
    planner = "['lucebox.engine.plan.lucebox', 'lucebox.engine.plan.lucebox.kvmodeview']"
    assert done.stderr.strip() == planner
    document = json.loads(done.stdout)
    assert (document["state"], document["model"], document["ctx"]) == ("ready", "smoke", 4096)
    assert document["sample"]["decode_tokens_per_s"] == 88.5
    assert document["cache"]["cached_prompt_share"] == 0.4
    assert document["cause"]["code"] == "segfault"
    assert document["engine"] == {
        "kind": "lucebox",
        "chosen_by": "measured",
        "reason": "the Lucebox engine is faster, measured on this card",
    }


def test_status_watch_json_streams_one_line_per_sample(tmp_path):
    paths = resolve_paths()
    status = serving(os.getpid(), a_sample(at_s=1.0, decode=50.0))
    runstate.write_status(paths, status)
    textfile = tmp_path / "lucebox.prom"
    watch = subprocess.Popen(
        lucebox("status", "--watch", "--json", "--prometheus", str(textfile)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert watch.stdout is not None
    try:
        first = json.loads(watch.stdout.readline())
        assert first["sample"]["decode_tokens_per_s"] == 50.0
        # The same sample rewritten (a state change elsewhere in the file) makes no new line.
        runstate.write_status(paths, replace(status, restarts=2))
        time.sleep(0.6)
        runstate.write_status(paths, replace(status, sample=a_sample(at_s=2.0, decode=60.0)))
        second = json.loads(watch.stdout.readline())
        assert second["sample"]["decode_tokens_per_s"] == 60.0
        assert "lucebox_decode_tokens_per_second 60.0" in textfile.read_text()
        runstate.state_file(paths).unlink()
        third = json.loads(watch.stdout.readline())
        assert third["state"] == "stopped"
        assert "lucebox_up 0" in textfile.read_text()
    finally:
        watch.send_signal(signal.SIGTERM)
        try:
            code = watch.wait(timeout=30)
        except subprocess.TimeoutExpired:
            watch.kill()
            watch.wait()
            raise
        assert code == 0
        watch.stdout.close()
        assert watch.stderr is not None
        assert watch.stderr.read() == ""
        watch.stderr.close()


def test_status_for_people_and_a_bad_textfile_path(tmp_path):
    done = subprocess.run(lucebox("status"), capture_output=True, text=True, check=False)
    assert done.returncode == 0
    assert done.stdout.startswith("stopped: no lucebox server is running")
    runstate.write_status(resolve_paths(), serving(os.getpid(), a_sample()))
    done = subprocess.run(lucebox("status"), capture_output=True, text=True, check=False)
    assert done.stdout.startswith("ready: smoke at http://127.0.0.1:8080")
    assert "decode 88.5 tok/s" in done.stdout and "prompt cached 40%" in done.stdout
    assert "last exit: segfault: the engine crashed (SIGSEGV)" in done.stdout
    assert "\n  engine: the Lucebox engine (measured on this card)\n" in done.stdout
    assert "1 restarts, 2 on purpose)" in done.stdout
    missing = tmp_path / "nowhere" / "lucebox.prom"
    done = subprocess.run(
        lucebox("status", "--prometheus", str(missing)), capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr.strip().startswith(f"lucebox: cannot write {missing}")
    assert "Traceback" not in done.stderr


def test_status_of_a_served_set_names_its_models_and_refuses_an_unknown_one():
    from lucebox.engine.run.servedsetmodels import ModelStatus

    paths = resolve_paths()
    models = (
        ModelStatus("smollm2", "loaded", "CPU", 340 * 2**20, 2.0, 1000 * 2**20),
        ModelStatus(
            "smoke", "unloaded", "CPU", 0, 700.0, 1300 * 2**20, last_slot="saved (812 tokens)"
        ),
    )
    runstate.write_status(paths, replace(serving(os.getpid(), a_sample()), models=models))
    one = subprocess.run(
        lucebox("status", "--model", "smoke", "--json"), capture_output=True, text=True, check=False
    )
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout)["state"] == "unloaded"
    assert json.loads(one.stdout)["last_slot"] == "saved (812 tokens)"
    people = subprocess.run(lucebox("status"), capture_output=True, text=True, check=False)
    assert "smollm2: loaded, 0.33 GiB of 0.98 GiB planned, used 2 s ago (CPU)\n" in people.stdout
    assert (
        "smoke: unloaded, 0.00 GiB of 1.27 GiB planned, used 700 s ago (CPU); slot saved (812 "
        in people.stdout
    )
    unknown = subprocess.run(
        lucebox("status", "--model", "gpt-4"), capture_output=True, text=True, check=False
    )
    assert unknown.returncode == 2
    assert "served models: smollm2, smoke" in unknown.stderr and "Traceback" not in unknown.stderr


def test_down_says_when_the_stop_could_not_save_the_conversation():
    """The server saves the agent's slot as it stops; when that fails, `down` says so (the next
    start reads the prompt again) instead of only "stopped"."""
    paths = resolve_paths()
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    reaper = threading.Thread(target=server.wait)
    reaper.start()
    runstate.write_status(paths, serving(server.pid, a_sample()))
    lock = runstate.ServeLock(paths)  # the running server holds it
    why = "the engine refused the save (HTTP 500): no slot is kept"
    record = {"pid": server.pid, "failure": why, "at_s": 1.0}
    (paths.runtime_dir / runstate.STOP_RECORD_NAME).write_text(json.dumps(record))
    try:
        done = subprocess.run(lucebox("down"), capture_output=True, text=True, timeout=60)
    finally:
        lock.release()
        reaper.join(timeout=10)
    assert done.returncode == 0 and done.stdout.strip() == f"stopped lucebox (pid {server.pid})"
    assert f"the conversation cache was not saved on this stop: {why}" in done.stderr
    assert runstate.slot_save_failure(paths, server.pid + 1) is None  # another process's


def test_status_says_the_engine_sleeps_and_since_when():
    from lucebox.engine.run.sleep import SleepStatus

    paths = resolve_paths()
    since = time.mktime((2026, 12, 6, 14, 5, 9, 0, 0, -1))
    asleep = replace(
        serving(os.getpid(), a_sample()), state="sleeping", sleep=SleepStatus(True, since, 600.0)
    )
    runstate.write_status(paths, asleep)
    people = subprocess.run(lucebox("status"), capture_output=True, text=True, check=False)
    assert people.stdout.startswith("sleeping: "), people.stdout
    assert "asleep since 14:05:09 (memory freed): the next request wakes it" in people.stdout
    runstate.write_status(
        paths, replace(asleep, state="ready", sleep=SleepStatus(False, since, 600))
    )
    people = subprocess.run(lucebox("status"), capture_output=True, text=True, check=False)
    assert "awake since 14:05:09: sleeps after 600 s without requests" in people.stdout


def test_status_says_what_the_start_restored_and_what_the_disk_cache_keeps():
    from lucebox.app.cli.status import status_line
    from lucebox.engine.machine import systemd
    from lucebox.engine.run.sample import CacheStatus

    cache = CacheStatus(
        0.4,
        0,
        last_restore="not restored: saved with another engine build",
        disk_entries=3,
        disk_bytes=3 * 2**30,
    )
    status = replace(serving(os.getpid(), a_sample()), cache=cache)
    unit = systemd.ServiceStatus(installed=False, enabled=False, scope="user")
    text = status_line(status, unit)
    assert "\n  last restore: not restored: saved with another engine build" in text
    assert "\n  disk prefix cache: 3 prompt states, 3.0 GiB" in text
    slots = replace(cache, disk_store="slots", disk_entries=2, disk_tokens=51200)
    text = status_line(replace(status, cache=slots), unit)
    assert "\n  saved conversations: 2 (51200 tokens), 3.0 GiB" in text


def test_status_shows_greedy_and_sampled_speed_ups_apart_with_their_spread():
    """The plain text words the speed-ups as the dashboard does, each with its spread where it
    ran more than once, and the engine verdict with its runs' spread; --json carries them."""
    from lucebox.app.cli.status import status_line
    from lucebox.engine.machine import systemd
    from lucebox.engine.plan.engineverdict import EngineCost
    from lucebox.engine.run.sample import EngineStatus, MeasuredRate, SamplingRate, SpecStatus

    apart = (
        SamplingRate(False, "greedy", 1.594, 0.9, spread=0.06, runs=2),
        SamplingRate(True, "t0.7", 1.12, 0.45),
    )
    mtp = MeasuredRate(690.0, 1100.0, 1.594, 4, 1.0)
    spec = SpecStatus("draft-mtp", True, "measured", 0.7, 2.5, mtp, apart)
    costs = (
        EngineCost("llama-server", 1.3, 80.0, 0.12, spread=0.08, runs=2),
        EngineCost("lucebox", 1.1, 120.0, 0.2, spread=0.04, runs=2),
    )
    why = (
        f"the Lucebox engine is faster, measured on this card: {costs[0].text()}; {costs[1].text()}"
    )
    status = replace(
        serving(os.getpid(), a_sample()), spec=spec, engine=EngineStatus("lucebox", "measured", why)
    )
    unit = systemd.ServiceStatus(installed=False, enabled=False, scope="user")
    text = status_line(status, unit)
    assert (
        "\n  speculation: MTP · greedy 1.59x measured ±3% over 2 runs, 90% accepted"
        " · sampled (t0.7) 1.12x measured, 45% accepted\n"
    ) in text
    # One figure for both samplings is no longer on the rates' line.
    assert "(measured)" not in text and "draft accepted" not in text
    assert (
        "\n  engine: the Lucebox engine (measured on this card)\n    the Lucebox engine is "
        "faster, measured on this card: llama-server 1.30 s a request (decode 80 tok/s, first "
        "token 0.12 s, ±4% over 2 runs); the Lucebox engine 1.10 s a request (decode 120 tok/s, "
        "first token 0.20 s, ±2% over 2 runs)\n"
    ) in text
    switched_off = replace(spec, active=False, reason="off: slower than none, 0.92x (...)")
    text = status_line(replace(status, spec=switched_off), unit)
    assert "speculation:" not in text and "MTP off: slower than none, 0.92x" in text

    runstate.write_status(resolve_paths(), status)
    done = subprocess.run(lucebox("status", "--json"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["spec"]["by_sampling"] == [
        {
            "sampled": False,
            "at": "greedy",
            "ratio": 1.594,
            "acceptance": 0.9,
            "spread": 0.06,
            "runs": 2,
        },
        {
            "sampled": True,
            "at": "t0.7",
            "ratio": 1.12,
            "acceptance": 0.45,
            "spread": 0.0,
            "runs": 1,
        },
    ]
