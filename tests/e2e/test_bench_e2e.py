"""`lucebox bench` against the real engine: a 3-call cut of the shipped agent session, the quick
prompt set, and `--compare cache=on,off` starting and stopping its own servers."""

from __future__ import annotations

import itertools
import json
import re
import time
from pathlib import Path

import pytest

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.run.front.samplingmix import client_fields
from lucebox.engine.run.runstate import current_status
from support.realmodels import smol_model
from support.smolserver import private_engine_home
from tests.conftest import alive, run_lucebox

pytestmark = pytest.mark.slow

SESSION = Path(__file__).resolve().parents[2] / "assets" / "agent-session.jsonl"


def bench(home: Path, *args: str):
    return run_lucebox("bench", *args, env={"LUCEBOX_HOME": str(home)}, timeout_s=1800)


def test_replay_of_three_calls_reuses_the_growing_prefix(smol_server, smol_home):
    result = bench(
        smol_home,
        "replay",
        str(SESSION),
        "--url",
        smol_server.url,
        "--calls",
        "3",
        "--n-gen",
        "8",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    replay = json.loads(result.stdout)["configs"]["default"]
    calls = replay["calls"]
    assert [call["index"] for call in calls] == [0, 1, 2]
    assert set(calls[0]) == {
        "index",
        "ttft_s",
        "decode_tok_s",
        "prompt_tokens",
        "cached_tokens",
        "empty",
    }
    prompts = [call["prompt_tokens"] for call in calls]
    assert prompts[0] < prompts[1] < prompts[2]
    # Each call's prompt extends the last one, so the engine serves that part from its cache.
    for before, call in itertools.pairwise(calls):
        assert call["cached_tokens"] >= before["prompt_tokens"] * 0.9
    assert replay["ttft_total_s"] == pytest.approx(sum(c["ttft_s"] for c in calls), abs=0.01)
    assert replay["empty"] == sum(c["empty"] for c in calls)
    assert replay["wall_s"] > 0


def test_quick_measures_the_running_server(smol_server, smol_home):
    paths = resolve_paths({"LUCEBOX_HOME": str(smol_home)})
    mix = current_status(paths).sampling
    result = bench(smol_home, "quick", "--n-gen", "4", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    # Measured at the sampling the served requests got (the defaults before any).
    assert mix is not None and document["sampling"]["default"] == client_fields(mix)
    counted = mix.greedy + mix.sampled + 7  # the warm-up and six prompts, through the front
    deadline = time.monotonic() + 10
    while (after := current_status(paths).sampling) is not None and time.monotonic() < deadline:
        if after.greedy + after.sampled >= counted:
            break
        time.sleep(0.3)
    assert after is not None and after.greedy + after.sampled == counted
    samples = document["configs"]["default"]
    assert list(samples) == ["chat", "code", "edit", "rewrite", "agent", "long"]  # probes, long
    for sample in samples.values():
        assert sample["ttft_s"] > 0 and sample["completion_tokens"] <= 4
        assert sample["prefill_tok_s"] > 0
    assert samples["long"]["prompt_tokens"] > 1500
    assert samples["chat"]["acceptance"] is None  # no speculation configured


def test_compare_serves_each_configuration_and_leaves_nothing_running(built_engine_home, tmp_path):
    home = private_engine_home(tmp_path / "compare-home")
    # A slot the user's own server saved: no configuration may start warm from it or replace it.
    slots = resolve_paths({"LUCEBOX_HOME": str(home)}).slots_dir
    slots.mkdir(parents=True)
    (slots / "users.slot").write_bytes(b"saved by the user's server")
    result = bench(
        home,
        "replay",
        str(SESSION),
        "--calls",
        "2",
        "--n-gen",
        "4",
        "--compare",
        "cache=on,off",
        "--model",
        str(smol_model()),
        "--ctx",
        "2048",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    configs = json.loads(result.stdout)["configs"]
    assert list(configs) == ["cache=on", "cache=off"]
    assert configs["cache=on"]["calls"][0]["cached_tokens"] < 72
    assert configs["cache=on"]["calls"][1]["cached_tokens"] > 0
    assert [c["cached_tokens"] for c in configs["cache=off"]["calls"]] == [0, 0]
    logs = sorted((home / "state" / "logs").glob("compare-*.log"))
    assert [log.name for log in logs] == ["compare-cache-off.log", "compare-cache-on.log"]
    engine_pids = [
        int(pid)
        for log in logs
        for pid in re.findall(r"engine started \(pid (\d+)", log.read_text())
    ]
    assert len(engine_pids) == 2 and not any(alive(pid) for pid in engine_pids)
    assert [p.name for p in slots.iterdir()] == ["users.slot"]
    assert (slots / "users.slot").read_bytes() == b"saved by the user's server"
    status = run_lucebox("status", "--json", env={"LUCEBOX_HOME": str(home)})
    assert json.loads(status.stdout)["state"] == "stopped"


@pytest.mark.parametrize("event", ["restart", "swap"])
def test_replay_between_restarts_reads_each_call_from_the_restored_slot(
    built_engine_home, tmp_path, event
):
    home = private_engine_home(tmp_path / "between-home")
    # The swap serves the same file: the only real chat model here (a base one is refused).
    between = "restart" if event == "restart" else f"swap:{smol_model()}"
    result = bench(
        home,
        "replay",
        str(SESSION),
        "--calls",
        "3",
        "--n-gen",
        "4",
        "--between",
        between,
        "--model",
        str(smol_model()),
        "--ctx",
        "4096",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    turns = json.loads(result.stdout)["between"]
    assert [turn["index"] for turn in turns] == [1, 2]
    for turn in turns:
        after, warm, cold = turn["after"], turn["warm"], turn["cold"]
        # The saved slot held the call before, so the call reads again only what it added, as
        # it did warm, and far less than an unrelated prompt of its size.
        assert after["cached_tokens"] >= 0.9 * warm["cached_tokens"] > 0, turns
        read_after = after["prompt_tokens"] - after["cached_tokens"]
        assert read_after < cold["prompt_tokens"] - cold["cached_tokens"], turns
        assert abs(cold["prompt_tokens"] - after["prompt_tokens"]) < 0.2 * after["prompt_tokens"]
        assert turn["kept_share"] is not None and turn["kept_share"] > 0.9, turns
    # What survived the restart is the whole call before: only the new tool result is read.
    before, last = turns[0]["after"], turns[1]["after"]
    assert last["cached_tokens"] >= 0.95 * before["prompt_tokens"], turns
    said = result.stderr
    assert said.count("restart: stopping" if event == "restart" else "swap: serving") == 2
    assert "read" in said and "of the warm cache kept" in said
    status = run_lucebox("status", "--json", env={"LUCEBOX_HOME": str(home)})
    assert json.loads(status.stdout)["state"] == "stopped"
