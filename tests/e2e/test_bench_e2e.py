"""`lucebox bench` against the real engine: a 3-call cut of the shipped agent session, the quick
prompt set, `--compare cache=on,off` starting and stopping its own servers, and `--between`
restarting, swapping or calibrating its own server between calls."""

from __future__ import annotations

import itertools
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.plan.speculation.measurements import store_file, write_section
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


def replay_between(home: Path, session: Path, between: str, *extra: str) -> Any:
    """`bench replay --between` of SmolLM2 over ``session``, four tokens a reply, as JSON."""
    return bench(
        home,
        "replay",
        str(session),
        *extra,
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


@pytest.mark.parametrize("event", ["restart", "swap"])
def test_replay_between_restarts_reads_each_call_from_the_restored_slot(
    built_engine_home, tmp_path, event
):
    home = private_engine_home(tmp_path / "between-home")
    # The swap serves the same file: the only real chat model here (a base one is refused).
    between = "restart" if event == "restart" else f"swap:{smol_model()}"
    result = replay_between(home, SESSION, between, "--calls", "3")
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


def agent_turns(path: Path) -> Path:
    """A two-call session in Claude Code's JSONL: a long project note, then one tool call and
    its short result, so the second call adds little to the first (the shipped session's
    second call adds ten times its first)."""
    note = "\n".join(
        f"- ledger/module{n}.py parses entry kind {n}, rounds amounts half-even, and logs "
        f"rejected line {n * 7} with its account"
        for n in range(24)
    )
    tool = {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "pytest"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "2 failed, 40 passed"}
    records = [
        ("user", f"Fix the failing ledger tests. Project notes:\n{note}"),
        ("assistant", [tool]),
        ("user", [result]),
        ("assistant", [{"type": "text", "text": "Both failures are in the parser."}]),
    ]
    lines = [{"type": role, "message": {"role": role, "content": c}} for role, c in records]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_replay_between_calibrations_reads_each_call_from_what_survived(
    built_engine_home, tmp_path
):
    home = private_engine_home(tmp_path / "calibrate-home")
    env = {"LUCEBOX_HOME": str(home)}
    # Short probes, as the calibration's own tests use (the bench keeps the user's length).
    done = run_lucebox("config", "set", "spec.probe_max_tokens", "16", env=env)
    assert done.returncode == 0, done.stderr
    paths = resolve_paths(env)
    write_section(paths, "entries", {"the user's launch": {"chosen": "off"}})
    users, settings = store_file(paths).read_bytes(), paths.config_file.read_bytes()
    result = replay_between(home, agent_turns(tmp_path / "session.jsonl"), "calibrate")
    assert result.returncode == 0, result.stderr
    (turn,) = json.loads(result.stdout)["between"]
    after, warm, cold = turn["after"], turn["warm"], turn["cold"]
    read_after = after["prompt_tokens"] - after["cached_tokens"]
    read_cold = cold["prompt_tokens"] - cold["cached_tokens"]
    print(
        f"after calibrate: ttft {after['ttft_s']} s, read {read_after} of "
        f"{after['prompt_tokens']}; warm {warm['ttft_s']} s, read "
        f"{warm['prompt_tokens'] - warm['cached_tokens']}; cold {cold['ttft_s']} s, read "
        f"{read_cold}"
    )
    # The calibration's restarts and probes took the engine, yet the conversation survived:
    # the call reads again only the tool call and result it added, as it did warm.
    assert read_after < 0.2 * after["prompt_tokens"], turn
    assert read_after < 0.2 * read_cold, turn
    assert turn["kept_share"] is not None and turn["kept_share"] > 0.9, turn
    said = result.stderr
    assert "calibrate: measured; it serves " in said, said
    # The bench's verdict was its own: the user's measurements and settings are as they were.
    assert store_file(paths).read_bytes() == users
    assert not list(store_file(paths).parent.glob("*.bench-*"))
    assert paths.config_file.read_bytes() == settings
    status = run_lucebox("status", "--json", env=env)
    assert json.loads(status.stdout)["state"] == "stopped"


def test_replay_between_calibrations_refuses_a_launch_without_speculation(
    built_engine_home, tmp_path
):
    home = private_engine_home(tmp_path / "spec-off-home")
    env = {"LUCEBOX_HOME": str(home)}
    assert run_lucebox("config", "set", "model.spec", "off", env=env).returncode == 0
    result = bench(
        home, "replay", str(SESSION), "--between", "calibrate", "--model", str(smol_model())
    )
    assert result.returncode == 2, result.stderr
    assert "would not calibrate: speculation is off" in result.stderr
    assert "--between restart" in result.stderr
    assert not (home / "state" / "logs" / "compare-default.log").exists()  # nothing served
