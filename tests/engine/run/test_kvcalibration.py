"""A long context's modes measured while the server runs, against the recorded-contract stand-in
of the Lucebox engine (support/luceboxfake.py), whose rates per mode the test sets: the exact cache
loses decode speed with the prompt's length, a KVFlash pool does not. Every mode is measured
over the probes and the long probe, each a restart, and stored; status shows them; and the mode
the plan serves serves again afterwards although a lossy one measured faster. A client that
comes while a mode being measured runs is served by the planned one, never by that mode."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from lucebox.engine.core.paths import Paths, resolve_paths
from lucebox.engine.core.units import GIB
from lucebox.engine.plan.launch import ServerLaunch, server_argv
from lucebox.engine.plan.lucebox import kvmodes
from lucebox.engine.plan.lucebox.kvmodes import KvModesPlan, KvTrial
from lucebox.engine.plan.lucebox.luceboxlaunch import LuceboxFlags
from lucebox.engine.plan.memory.memory import Plan
from lucebox.engine.plan.memory.sizes import MemoryBytes
from lucebox.engine.plan.samplingdefaults import sampling_defaults
from lucebox.engine.run import runstate
from lucebox.engine.run.calibrate.kvcalibrator import KvModeCalibrator, KvSetup
from lucebox.engine.run.calibrate.probing import ProbePace
from lucebox.engine.run.runsetup import Calibrations, RunFacts
from lucebox.engine.run.serverrun.serverrun import ServerRun
from lucebox.engine.run.supervisor import Supervisor
from support import luceboxfake
from support.ports import free_port
from tests.e2e.test_enginecalibration import until

FAKE = Path(luceboxfake.__file__)
CTX = 65536
POOL = 16384
MEMORY = MemoryBytes(0, 0, 0, 0, 0, 0, 8 * GIB)
SERVED = "exact q8_0"
RULE_SAMPLING = sampling_defaults(None, None).label
CANNOT = "the plan does not fit: 547 MiB KV for 65536 tokens"
RATES: dict[str, Any] = {
    "decode_tok_s": 400.0,
    "prefill_tok_s": 1e6,
    "modes": {
        "exact q8_0": {"decode_tok_s": 400.0, "prefill_tok_s": 1e6, "long_drop": 0.5},
        "exact q4_0": {"decode_tok_s": 380.0, "prefill_tok_s": 1e6, "long_drop": 0.6},
        # Each of its replies takes a while: a client comes while it is measured.
        "kvflash q8_0": {"decode_tok_s": 390.0, "prefill_tok_s": 1e6, "sleep_s": 0.4},
    },
}


def launches(tmp_path: Path) -> dict[str, ServerLaunch]:
    """Each mode's launch as the planner makes it: the same engine, ports and context, the
    engine behind lucebox's front."""
    script = tmp_path / "dflash_server"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE} "$@"\n')
    script.chmod(0o755)
    port, engine_port = free_port(), free_port()
    found = {}
    for label, pool in (("exact q8_0", None), ("exact q4_0", None), ("kvflash q8_0", POOL)):
        kv_type = label.split()[1]
        plan = Plan(True, CTX, kv_type, kv_type, -1, 0, 1, MEMORY, pool)
        flags = LuceboxFlags(
            max_ctx=CTX, max_tokens=512, cache_type=kv_type, prefix_cache_slots=4, kvflash_pool=pool
        )
        found[label] = ServerLaunch(
            str(script), "/m/qwen35.gguf", plan, "tiny", port=port, engine_port=engine_port,
            kind="lucebox", lucebox=flags,
        )  # fmt: skip
    return found


def mode_setup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rates: dict[str, Any]
) -> tuple[dict[str, ServerLaunch], Paths, KvSetup]:
    """Each mode's launch, a home and the setup the calibration measures them with: the
    stand-in answers at ``rates``; "kvflash q4_0" cannot serve (the planner's refusal)."""
    monkeypatch.setenv("FAKE_REQUESTS", str(tmp_path / "requests.txt"))
    rates_file = tmp_path / "rates.json"
    rates_file.write_text(json.dumps(rates))
    monkeypatch.setenv("FAKE_RATES", str(rates_file))
    planned = launches(tmp_path)
    trials = kvmodes.trials_for(("q8_0", "q4_0"))
    # Keyed at the sampling the front fills in (llama.cpp's rule, 0.8), as the planner keys it.
    key = kvmodes.at_sampling("qwen35 | - | build | card | 65536", RULE_SAMPLING)
    modes = KvModesPlan(key, trials, SERVED, CTX // 2)

    def plan_trial(trial: KvTrial) -> ServerLaunch | str:
        return planned.get(trial.label) or CANNOT

    setup = KvSetup(modes, ProbePace(0.5, 8), plan_trial, lambda: planned[SERVED])
    return planned, resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")}), setup


async def test_every_mode_is_measured_and_shown_and_the_planned_one_serves_again(
    tmp_path, monkeypatch
):
    requests = tmp_path / "requests.txt"
    planned, paths, setup = mode_setup(tmp_path, monkeypatch, RATES)
    calibration = KvModeCalibrator(paths, setup)
    assert calibration.state == "waiting"
    supervisor = Supervisor(planned[SERVED], tmp_path / "engine.log", ready_timeout_s=60)
    run = ServerRun(
        paths,
        supervisor,
        RunFacts(model="tiny", gpu_index=0),
        calibrations=Calibrations(kv_modes=calibration),
    )

    def settled() -> bool:
        status = runstate.read_status(paths)
        shown = status.kv_modes if status is not None else None
        back = server_argv(run.supervisor.launch) == server_argv(planned[SERVED])
        done = calibration.state == "done" and run.status.state == "ready" and back
        return done and shown is not None and shown.state == "done"

    def said() -> str:
        log = (tmp_path / "engine.log").read_text(errors="replace")[-2000:]
        return f"{calibration.state} {calibration.trial} {calibration.measurement}\n{log}"

    async def consume() -> None:
        async for _ in run.events():
            pass

    def pooled_running() -> bool:
        trial = calibration.trial
        measuring = calibration.state == "running" and trial is not None
        running = run.supervisor.launch == planned["kvflash q8_0"] and run.status.state == "ready"
        return measuring and running and trial is not None and trial.label == "kvflash q8_0"

    task = asyncio.create_task(consume())
    try:
        await until(pooled_running, 120, said)
        body = {"messages": [{"role": "user", "content": "client question"}], "max_tokens": 8}
        async with httpx.AsyncClient(timeout=60) as client:
            answer = await client.post(f"{run.public_url}/v1/chat/completions", json=body)
        assert answer.status_code == 200

        def log() -> str:
            return (tmp_path / "engine.log").read_text(errors="replace")

        # The engine's lines reach its log a moment after its reply.
        await until(lambda: "answers: client question" in log(), 10, log)
        assert "[fake] exact q8_0 answers: client question" in log()
        assert "[fake] kvflash q8_0 answers: client" not in log()
        await until(settled, 120, said)
        measured = calibration.measurement
        assert {r.label for r in measured.rates} == set(planned)
        assert measured.refused == (("kvflash q4_0", CANNOT),)
        long_rates = {}
        for rate in measured.rates:
            long = rate.long
            assert long is not None and long.prompt_tokens > CTX // 2, rate
            assert [p.name for p in rate.probes][-1] == kvmodes.LONG_PROBE
            long_rates[rate.label] = long.tok_s
        # The exact cache lost speed after the long prompt, the pool did not.
        assert long_rates["kvflash q8_0"] == pytest.approx(390.0, rel=0.02)
        assert long_rates["exact q8_0"] < 0.8 * 400.0
        assert long_rates["kvflash q8_0"] > long_rates["exact q8_0"]
        # Every mode ran as its own engine, each mode once, and the planned one serves again.
        argvs = [json.loads(line[5:]) for line in requests.read_text().splitlines()
                 if line.startswith("ARGV ")]  # fmt: skip
        # The pool's measurement was cut by the client and done again once idle.
        assert ["--kvflash" in argv for argv in argvs] == [False, False, True, False, True, False]
        assert [argv[argv.index("--cache-type-k") + 1] for argv in argvs] == ["q8_0", "q4_0"] + [
            "q8_0"
        ] * 4
        status = runstate.read_status(paths)
        assert status is not None and status.kv_modes is not None
        shown = status.kv_modes
        assert shown.modes[0].label == SERVED and shown.modes[0].serving
        assert shown.unmeasured == ()
        pooled = next(m for m in shown.modes if m.label == "kvflash q8_0")
        assert pooled.gives_up.startswith("exactness: sparse attention over a 16,384-token pool")
        assert any(line.startswith("exact q8_0 (serving): ") for line in shown.lines())
        # Stored at the served sampling: the next run of the same launch measures nothing again.
        assert measured.key.endswith(f" | {RULE_SAMPLING}")
        assert KvModeCalibrator(paths, setup).state == "done"
    finally:
        run.stop()
        await asyncio.wait_for(task, 60)


async def test_a_mode_that_dies_at_start_is_kept_as_cannot_serve_and_the_planned_one_serves(
    tmp_path, monkeypatch
):
    """Its death is the trial's answer: the supervisor goes straight back to the planned
    launch (no re-plan for memory, no count toward giving up), and the mode is stored with
    why it cannot serve here, so it is not tried at every start."""
    dying = {**RATES["modes"], "exact q4_0": {"decode_tok_s": 380.0, "start_exit": 1}}
    planned, paths, setup = mode_setup(tmp_path, monkeypatch, {**RATES, "modes": dying})
    calibration = KvModeCalibrator(paths, setup)
    supervisor = Supervisor(planned[SERVED], tmp_path / "engine.log", ready_timeout_s=60)
    oom_replans: list[ServerLaunch] = []

    def replan_on_oom(launch: ServerLaunch) -> ServerLaunch | None:
        oom_replans.append(launch)
        return None

    supervisor.replan_on_oom = replan_on_oom
    run = ServerRun(
        paths,
        supervisor,
        RunFacts(model="tiny", gpu_index=0),
        calibrations=Calibrations(kv_modes=calibration),
    )

    async def consume() -> None:
        async for _ in run.events():
            pass

    def settled() -> bool:
        back = server_argv(run.supervisor.launch) == server_argv(planned[SERVED])
        return calibration.state == "done" and run.status.state == "ready" and back

    task = asyncio.create_task(consume())
    try:
        await until(settled, 120, lambda: str(calibration.measurement))
        refused = dict(calibration.measurement.refused)
        assert refused["exact q4_0"].startswith("the engine did not run with it here: ")
        assert "out of memory" in refused["exact q4_0"]
        assert {r.label for r in calibration.measurement.rates} == {SERVED, "kvflash q8_0"}
        assert oom_replans == [] and supervisor.fallback is None
        stored = kvmodes.read_modes(paths, setup.modes.key)
        assert stored is not None and "exact q4_0" in dict(stored.refused)
        assert KvModeCalibrator(paths, calibration.setup).state == "done"
    finally:
        run.stop()
        await asyncio.wait_for(task, 60)
