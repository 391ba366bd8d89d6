"""The engine calibration on the real llama-server (the suite's CPU build, SmolLM2) against the
recorded-contract stand-in of the Lucebox engine (support/luceboxfake.py), whose per-token rates
the test sets while it runs: the faster engine for the served mix serves after one switch, and
the choice flips back each time the served mix moves.

The Lucebox engine needs an NVIDIA GPU and a second engine compile, so the stand-in replies in
the engine's recorded shapes with the rates given; both launches share one port, as a
re-planned launch does.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx
import pytest

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.core.units import GIB
from lucebox.engine.engines import registry
from lucebox.engine.engines.registry import KindName
from lucebox.engine.plan import engineverdict
from lucebox.engine.plan.launch import ServerLaunch
from lucebox.engine.plan.lucebox.luceboxlaunch import LuceboxFlags
from lucebox.engine.plan.memory.memory import Plan
from lucebox.engine.plan.memory.sizes import MemoryBytes
from lucebox.engine.run.calibrate.enginecalibrator import EngineCalibrator, EngineSetup
from lucebox.engine.run.calibrate.probing import ProbePace
from lucebox.engine.run.kinds.luceboxrun import parse_reply, reply_from_usage
from lucebox.engine.run.runsetup import Calibrations, RunFacts
from lucebox.engine.run.serverrun.serverrun import ServerRun
from lucebox.engine.run.supervisor import Supervisor
from support import luceboxfake
from support.luceboxfake import rated_reply
from support.ports import free_port
from support.realmodels import smol_model

pytestmark = pytest.mark.slow

FAKE = Path(luceboxfake.__file__)
KEY = "smol | - | CPU | 2048"
MEMORY = MemoryBytes(0, 0, 0, 0, 0, 0, 8 * GIB)


def launches(home: Path, tmp_path: Path) -> dict[KindName, ServerLaunch]:
    paths = resolve_paths({"LUCEBOX_HOME": str(home)})
    llama = next(e for e in registry.list_engines(paths) if e.kind == "llama-server")
    script = tmp_path / "dflash_server"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE} "$@"\n')
    script.chmod(0o755)
    port = free_port()
    plan = Plan(True, 2048, "f16", "f16", 0, 0, 1, MEMORY, None)
    flags = LuceboxFlags(max_ctx=2048, max_tokens=512, cache_type="q4_0", prefix_cache_slots=4)
    return {
        "llama-server": ServerLaunch(llama.server_path, str(smol_model()), plan, "smol", port=port),
        "lucebox": ServerLaunch(
            str(script), "/m/qwen35.gguf", plan, "smol", port=port, kind="lucebox", lucebox=flags
        ),
    }


def set_rates(path: Path, decode_tok_s: float, prefill_tok_s: float) -> None:
    path.write_text(json.dumps({"decode_tok_s": decode_tok_s, "prefill_tok_s": prefill_tok_s}))


def test_the_stand_in_speaks_what_the_real_parsers_read(tmp_path, monkeypatch, capsys):
    body = {"messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 50}
    reply = json.loads(rated_reply(body, {"decode_tok_s": 100.0, "prefill_tok_s": 1000.0}))
    assert reply_from_usage(reply["usage"]) == (100, 50, 0.1, 0.5, 0.0)
    done = next(
        line for line in capsys.readouterr().err.splitlines() if "chat DONE" in line
    )  # fmt: skip
    parsed = parse_reply(done)
    assert parsed is not None and parsed.prompt_tokens == 100
    assert parsed.completion_tokens == 50 and parsed.decode_s == 0.5


async def _send(url: str, prompt: str, max_tokens: int, count: int) -> None:
    """``count`` requests of ``max_tokens`` reply tokens each (the end of text ignored, so the
    served mix has the reply lengths the test means)."""
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    async with httpx.AsyncClient(timeout=120) as client:
        for _ in range(count):
            reply = await client.post(f"{url}/v1/chat/completions", json=body)
            assert reply.status_code == 200


async def until(check, timeout_s: float, said) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        assert loop.time() < deadline, said()
        await asyncio.sleep(0.2)


async def test_the_faster_engine_for_the_served_mix_serves_and_flips_back_when_it_moves(
    built_engine_home, tmp_path, monkeypatch
):
    monkeypatch.setenv("FAKE_REQUESTS", str(tmp_path / "requests.txt"))
    rates = tmp_path / "rates.json"
    monkeypatch.setenv("FAKE_RATES", str(rates))
    set_rates(rates, 1e5, 1e6)  # one way: the stand-in is faster at everything
    planned = launches(built_engine_home, tmp_path)
    paths = resolve_paths({"LUCEBOX_HOME": str(tmp_path / "home")})

    def plan_engine(kind: KindName | None) -> tuple[ServerLaunch, str]:
        """The planner's answer: the kind asked for, else the stored verdict."""
        found = engineverdict.read_engines(paths, KEY)
        chosen = kind or (found.chosen if found and found.chosen else "llama-server")
        return planned[chosen], f"served by {chosen}"

    setup = EngineSetup(KEY, None, ProbePace(0.5, 8), plan_engine, lambda launch: None)
    calibration = EngineCalibrator(paths, setup)
    supervisor = Supervisor(planned["llama-server"], tmp_path / "engine.log", ready_timeout_s=120)
    run = ServerRun(
        paths,
        supervisor,
        RunFacts(model="smol", gpu_index=0),
        calibrations=Calibrations(engine=calibration),
    )

    def serving() -> KindName:
        return run.supervisor.launch.kind

    def settled(kind: KindName) -> bool:
        ready = run.status.state == "ready" and calibration.state == "done"
        return ready and calibration.measurement.chosen == kind and serving() == kind

    def said() -> str:
        log = (tmp_path / "engine.log").read_text(errors="replace")[-3000:]
        m = calibration.measurement
        return (
            f"state {calibration.state} kind {calibration.kind} serving {serving()} "
            f"status {run.status.state} chosen {m.chosen} why {m.why} "
            f"trials {[k for k, _ in m.trials]} served {len(calibration.served)}\n{log}"
        )

    async def consume() -> None:
        async for _ in run.events():
            pass

    task = asyncio.create_task(consume())
    try:
        await until(lambda: settled("lucebox"), 240, said)
        first = calibration.measurement
        assert calibration.switches == 1
        assert first.why.startswith("the Lucebox engine is faster, measured on this card over")
        llama = first.trial("llama-server")
        assert llama is not None and llama.label.startswith("llama-server")
        assert all(p.prefill_s > 0 and p.prompt_tokens > 0 for p in llama.probes)
        # The other way, by the mix: the stand-in decodes 50x faster than llama-server measured
        # but reads prompts 4x slower, so long prompts with short replies (an agent's turns) go
        # to llama-server and short prompts with longer replies to the stand-in (for any
        # llama-server whose prompt reading is 4x to 300x its decode).
        decode = llama.tok_s
        read = sum(p.prompt_tokens for p in llama.probes) / sum(p.prefill_s for p in llama.probes)
        set_rates(rates, 50 * decode, read / 4)
        agent_turn = "Here is the tool output:\n" + "line of output from the tool\n" * 60
        await _send(run.url, agent_turn, 4, 20)
        await until(lambda: settled("llama-server"), 240, said)
        second = calibration.measurement
        assert second.remeasure_at > first.remeasure_at
        assert second.why.startswith(
            "llama-server is faster, measured on this card over the served mix"
        )
        assert calibration.switches == 2
        # Short prompts with long replies: decode decides, and the stand-in decodes 50x faster.
        await _send(run.url, "Hi", 128, 20)
        await until(lambda: settled("lucebox"), 240, said)
        assert calibration.switches == 3
        assert "the served mix" in calibration.measurement.why
        stored = engineverdict.read_engines(paths, KEY)
        assert stored is not None and stored.chosen == "lucebox"
    finally:
        run.stop()
        await asyncio.wait_for(task, 60)
