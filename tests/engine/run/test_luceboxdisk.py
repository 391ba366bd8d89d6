"""The Lucebox stand-in's disk prefix cache against the planned flags: a conversation comes
back from disk after a stop and a start, and never into another build's or KV type's launch.
The stand-in parses and logs as the pinned engine does (support/luceboxdisk.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.core.prefixstore import RECORD_NAME, PrefixKey
from lucebox.engine.core.units import GIB, MIB
from lucebox.engine.plan.launch import ServerLaunch
from lucebox.engine.plan.lucebox.diskcache import DiskCache, DiskCacheRequest, plan_disk_cache
from lucebox.engine.plan.lucebox.luceboxlaunch import LuceboxFlags, dflash_server_argv
from lucebox.engine.run.kinds.luceboxrun import LuceboxLog
from lucebox.engine.run.runsetup import RunFacts
from lucebox.engine.run.sample import CacheStatus, Sample
from lucebox.engine.run.serverrun.serverrun import ServerRun
from lucebox.engine.run.supervision.serverevent import ServerEvent
from lucebox.engine.run.supervisor import Supervisor
from support import luceboxfake
from support.ports import free_port
from tests.engine.run.test_luceboxserve import lucebox_spec

SYSTEM = "You are a careful coding agent. " * 140
TURN_1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "first question"}]
TURN_2 = [
    *TURN_1,
    {"role": "assistant", "content": "an answer"},
    {"role": "user", "content": "more"},
]


class Engine:
    """The stand-in started with a launch's argv; its log is read after it stopped."""

    def __init__(self, argv: list[str], tmp_path: Path) -> None:
        self.log = tmp_path / f"engine-{time.monotonic_ns()}.log"
        self.port = int(argv[argv.index("--port") + 1])
        env = {**os.environ, "FAKE_REQUESTS": str(tmp_path / "requests")}
        command = [sys.executable, "-m", "support.luceboxfake", *argv[1:]]
        with self.log.open("w") as out:
            self.process = subprocess.Popen(command, stderr=out, env=env)

    def wait_listening(self) -> None:
        for _ in range(200):
            if "listening on" in self.log.read_text():
                return
            time.sleep(0.05)
        raise AssertionError(self.log.read_text())

    def chat(self, messages: list[dict]) -> None:
        reply = httpx.post(
            f"http://127.0.0.1:{self.port}/v1/chat/completions",
            json={"messages": messages, "max_tokens": 8},
            timeout=10,
        )
        assert reply.status_code == 200

    def stop(self) -> str:
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(timeout=10) == 0
        return self.log.read_text()


def argv_for(key: PrefixKey, root: Path, kv_type: str = "q4_0") -> list[str]:
    disk = plan_disk_cache(DiskCacheRequest(str(root), key, 100 * GIB))
    flags = LuceboxFlags(4096, 512, kv_type, 4, disk_cache=disk)
    return dflash_server_argv("dflash_server", key.model_path, "m", free_port(), flags, None)


def restored_by(log: str) -> str | None:
    """What ``status`` says the start restored, read from the log by lucebox's own reader."""
    reader = LuceboxLog()
    for line in log.splitlines():
        reader.feed(line)
    return reader.disk_restore


def served(argv: list[str], tmp_path: Path, messages: list[dict]) -> str:
    engine = Engine(argv, tmp_path)
    engine.wait_listening()
    engine.chat(messages)
    return engine.stop()


def test_after_a_stop_and_a_start_the_conversation_is_read_from_disk_in_its_folder_only(
    tmp_path,
):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    key = PrefixKey(str(model), 4, 1, "build-a", "q4_0", "q4_0", 4096)
    root = tmp_path / "prefix"
    first = served(argv_for(key, root), tmp_path, TURN_1)
    assert "[disk-cache] shutdown: saving 1 tracked slots" in first
    assert "[disk-cache] saved " in first and "disk_hit=false" in first

    again = served(argv_for(key, root), tmp_path, TURN_2)
    assert "[disk-cache] hit policy=auto:30 len=1123 slot=63 pos=1123" in again
    assert "restore=true slot=63 prefix_len=1123" in again and "disk_hit=true" in again
    assert restored_by(again) == "read 1123 tokens from the disk prefix cache"

    other_build = dataclasses.replace(key, engine_build="build-b")
    other_kv = dataclasses.replace(key, cache_type_k="q8_0", cache_type_v="q8_0")
    for other, kv_type in ((other_build, "q4_0"), (other_kv, "q8_0")):
        missed = served(argv_for(other, root, kv_type), tmp_path, TURN_2)
        assert "[disk-cache] hit" not in missed and "disk_hit=false" in missed


@pytest.mark.parametrize("policy", ["bogus", "auto:0", "0", "auto:x"])
def test_a_policy_the_engine_refuses_ends_it_with_status_2_and_its_line(tmp_path, policy):
    argv = ["m.gguf", "--port", str(free_port()), "--disk-prefix-cache", policy]
    env = {**os.environ, "FAKE_REQUESTS": str(tmp_path / "requests")}
    done = subprocess.run(
        [sys.executable, luceboxfake.__file__, *argv], env=env, capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "[server] --disk-prefix-cache must be off, full, auto, auto:<window>, or a positive "
        "token count"
    )


def test_paged_attention_turns_the_disk_cache_off_with_the_engines_line(tmp_path):
    key = PrefixKey(str(tmp_path / "m.gguf"), 4, 1, "build-a", "q4_0", "q4_0", 4096)
    log = served([*argv_for(key, tmp_path / "prefix"), "--paged-attention"], tmp_path, TURN_1)
    assert "[server] --paged-attention disables prefix/prefill snapshots" in log
    assert "[disk-cache]" not in log and not (tmp_path / "prefix").exists()


def test_a_cut_saved_state_is_removed_and_status_says_why(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    key = PrefixKey(str(model), 4, 1, "build-a", "q4_0", "q4_0", 4096)
    root = tmp_path / "prefix"
    served(argv_for(key, root), tmp_path, TURN_1)
    (state,) = root.glob("*/*/*.dkv")
    state.write_bytes(state.read_bytes()[:200])  # the header whole, the tensors cut short
    log = served(argv_for(key, root), tmp_path, TURN_2)
    assert f"[disk-cache] lookup failed, removing {state}" in log and "disk_hit=false" in log
    assert restored_by(log) == "not restored from disk: a saved state could not be read (removed)"


async def _one_turn(tmp_path: Path, launch: ServerLaunch, messages: list[dict]) -> CacheStatus:
    """One start of ``launch`` through the supervisor, one client turn, the stop; what the
    status said of the cache once the turn was counted."""
    supervisor = Supervisor(launch, tmp_path / "engine.log", ready_timeout_s=20)
    run = ServerRun(resolve_paths(), supervisor, RunFacts(model="m", gpu_index=0))
    cache = None
    async with asyncio.timeout(60):
        async for item in run.events():
            if isinstance(item, ServerEvent) and item.kind == "ready":
                async with httpx.AsyncClient(timeout=10) as client:
                    url = f"http://127.0.0.1:{launch.port}/v1/chat/completions"
                    reply = await client.post(url, json={"messages": messages, "max_tokens": 8})
                assert reply.status_code == 200
            elif isinstance(item, Sample) and item.requests_finished_total >= 1:
                cache = run.status.cache
                run.stop()
    assert cache is not None
    return cache


async def test_serve_readies_the_folder_trims_older_ones_and_status_shows_the_restore(
    tmp_path, monkeypatch
):
    """Through the supervisor and run as `lucebox serve` runs the engine: each start writes
    the folder's record and drops other folders past the budget, least recently used first;
    the start after a stop reads the conversation from disk and status says so."""
    monkeypatch.setenv("FAKE_REQUESTS", str(tmp_path / "requests"))
    spec = lucebox_spec(tmp_path)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    key = PrefixKey(str(model), 4, 1, "build-a", "q4_0", "q4_0", 4096)
    root = tmp_path / "prefix"
    stale = root / "old-model-0123456789abcdef"
    (stale / "layout").mkdir(parents=True)
    (stale / "layout" / "a.dkv").write_bytes(bytes(2 * MIB))
    os.utime(stale, (1, 1))
    os.utime(stale / "layout", (1, 1))
    disk = DiskCache(f"{root}/{key.folder_name}", 1, 1024, "auto", "", key)
    assert spec.lucebox is not None
    flags = replace(spec.lucebox, disk_cache=disk)
    launch = replace(spec, model_path=str(model), lucebox=flags)

    first = await _one_turn(tmp_path, launch, TURN_1)
    assert not stale.exists()
    assert (
        f"# lucebox: saved prompt states over budget: removed {stale}"
        in (tmp_path / "engine.log").read_text()
    )
    assert json.loads((root / key.folder_name / RECORD_NAME).read_text())["engine_build"] == (
        "build-a"
    )
    assert first.last_restore is None and first.disk_entries == 0
    again = await _one_turn(tmp_path, launch, TURN_2)
    assert again.last_restore == "read 1123 tokens from the disk prefix cache"
    assert again.disk_entries == 1 and (again.disk_bytes or 0) > 1123

    rebuilt = replace(key, engine_build="build-b", cache_type_k="q8_0", cache_type_v="q8_0")
    elsewhere = replace(disk, folder=f"{root}/{rebuilt.folder_name}", key=rebuilt)
    other = await _one_turn(
        tmp_path, replace(launch, lucebox=replace(flags, disk_cache=elsewhere)), TURN_2
    )
    assert other.last_restore == (
        "not restored: the states kept on disk were saved with another engine build, "
        "another KV type"
    )


def test_an_engine_saving_to_disk_gets_longer_to_exit_within_what_down_waits(tmp_path):
    from lucebox.engine.run import prefixdisk, runstate

    spec = lucebox_spec(tmp_path)
    assert spec.lucebox is not None
    key = PrefixKey("/m/q.gguf", 4, 1, "build-a", "q4_0", "q4_0", 4096)
    saving = replace(
        spec,
        lucebox=replace(spec.lucebox, disk_cache=DiskCache("/c/f", 1, 1024, "auto", "", key)),
    )
    assert prefixdisk.stop_timeout_s(spec, 15.0) == 15.0
    assert 15.0 < prefixdisk.stop_timeout_s(saving, 15.0) < runstate.STOP_TIMEOUT_S
