"""Both engines compared on auto, through the path `lucebox serve` takes with nothing pinned:
``prepare`` (the one planner) with both kinds installed, then ``runstart.server_run`` with its
calibrations on. The real llama-server (the suite's CPU build) serves a generated qwen35
target; the Lucebox engine, which needs an NVIDIA GPU, is the recorded-contract stand-in
(support/luceboxfake.py) installed as a build by the install's own constructors, and NVML is the
scripted provider showing one H100.

The Lucebox draft makes the rule pick the Lucebox engine. Set slower than llama-server, the
stand-in loses: only a calibration that really measures llama-server serves it. Set faster, it
wins and serves again after llama-server's trial (its warm-up then not counted as a client's).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
import pytest

from lucebox.engine import pipeline, runstart
from lucebox.engine.core.paths import Paths, resolve_paths
from lucebox.engine.core.units import GIB
from lucebox.engine.engines.kindname import KIND_TEXT
from lucebox.engine.machine import config, gpu
from lucebox.engine.plan import engineverdict
from lucebox.engine.plan.options import ServeOptions
from lucebox.engine.run import runstate
from lucebox.engine.run.front.frontwire import CARRIES_TOKEN
from support.ggufgen import LuceboxDFlashSpec, cached_gguf, qwen35_target
from support.luceboxfake import __file__ as FAKE
from support.ports import free_port
from support.smolserver import private_engine_home
from tests.e2e.test_enginecalibration import until
from tests.engine.builds import lucebox_build
from tests.engine.fake_nvml import FakeGpu, FakeNvml

pytestmark = pytest.mark.slow

H100 = FakeGpu(name="NVIDIA H100 80GB HBM3", total_bytes=80 * GIB, capability=(9, 0))


def _install_stand_in(paths: Paths) -> None:
    """The Lucebox engine installed as a build publishes it, its binary the stand-in."""
    manifest = lucebox_build(paths, "4cf58a04", "2026-12-06T00:00:00Z")
    server = Path(manifest.server_path)
    server.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE} "$@"\n')
    server.chmod(0o755)


async def _chat(url: str, count: int) -> list[float]:
    """``count`` streamed chats as a chat app sends them on its open connection; what each
    waited for its first token."""
    waits = []
    async with httpx.AsyncClient(timeout=120) as client:
        assert (await client.get(f"{url}/health")).status_code == 200  # the connection is open
        for number in range(count):
            prompt = f"Summarise note {number}: " + "the model reads every word of a prompt " * 8
            body = {
                "messages": [{"role": "user", "content": prompt}],
                **{"max_tokens": 8, "stream": True, "ignore_eos": True},
            }
            sent_s = time.perf_counter()
            async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as reply:
                assert reply.status_code == 200
                first = None
                async for chunk in reply.aiter_raw():
                    if first is None and CARRIES_TOKEN.search(chunk):
                        first = time.perf_counter() - sent_s
            assert first is not None
            waits.append(first)
    return waits


RATES = {
    "llama-server": {"decode_tok_s": 5.0, "prefill_tok_s": 50.0},
    "lucebox": {"decode_tok_s": 1e5, "prefill_tok_s": 1e6},
}
"""The stand-in's rates that make ``kind`` the faster engine."""


@pytest.mark.parametrize("faster", ["llama-server", "lucebox"])
async def test_serve_on_auto_measures_both_engines_and_serves_the_faster(
    built_engine_home, tmp_path, monkeypatch, faster
):
    home = private_engine_home(tmp_path / "home")
    monkeypatch.setenv("LUCEBOX_HOME", str(home))
    paths = resolve_paths({"LUCEBOX_HOME": str(home)})
    config.set_setting(paths, "spec.calibrate_idle_s", "1")
    config.set_setting(paths, "server.port", str(free_port()))
    _install_stand_in(paths)
    monkeypatch.setattr(gpu, "PynvmlProvider", lambda: FakeNvml(gpus=[H100]))
    rates = tmp_path / "rates.json"
    rates.write_text(json.dumps(RATES[faster]))
    monkeypatch.setenv("FAKE_RATES", str(rates))
    monkeypatch.setenv("FAKE_REQUESTS", str(tmp_path / "requests.txt"))
    target = cached_gguf(qwen35_target(mtp=False))
    draft = cached_gguf(LuceboxDFlashSpec())
    options = ServeOptions(model=str(target), draft=str(draft))

    prepared = pipeline.prepare(paths, options, lambda event: None)
    assert prepared.launch.engine_kind == "lucebox"  # the rule: a Lucebox draft
    assert prepared.launch.engine_choice is not None and prepared.launch.engine_choice.both
    run = runstart.server_run(paths, prepared, runstart.new_supervisor(paths, prepared))
    calibration = run.calibrations.engine
    assert calibration is not None, "both engines are installed: the calibration must run"

    def said() -> str:
        log = runstate.engine_log(paths).read_text(errors="replace")[-3000:]
        m = calibration.measurement
        return (
            f"state {calibration.state} serving {run.supervisor.launch.kind} "
            f"trials {[k for k, _ in m.trials]} chosen {m.chosen}\n{log}"
        )

    def settled() -> bool:
        done = calibration.state == "done" and calibration.measurement.trials
        return bool(done) and run.status.state == "ready"

    async def consume() -> None:
        async for _ in run.events():
            pass

    task = asyncio.create_task(consume())
    try:
        await until(settled, 300, said)
        assert run.supervisor.launch.kind == faster, said()
        stored = engineverdict.read_engines(paths, calibration.setup.key)
        assert stored is not None and stored.chosen == faster, said()
        assert {kind for kind, _ in stored.trials} == {"llama-server", "lucebox"}
        assert stored.why.startswith(f"{KIND_TEXT[faster]} is faster, measured on this card")
        engine = run.engine_status()
        assert engine is not None and (engine.kind, engine.chosen_by) == (faster, "measured")
        waits = await _chat(run.public_url, 5)
        await until(
            lambda: (
                (s := runstate.read_status(paths)) is not None
                and s.sample is not None
                and s.sample.requests_finished_total == 5
            ),
            30,
            lambda: f"{runstate.read_status(paths)}",
        )
        shown = runstate.read_status(paths)
        assert shown is not None and shown.engine is not None
        assert shown.engine.to_json()["kind"] == faster
        assert shown.engine.chosen_by == "measured"
        # Measured where clients wait: within 10% of what they waited for the first token
        # (and of the 5 ms a client here may spend connecting and parsing on a busy machine).
        assert shown.sample is not None and shown.sample.ttft_s is not None
        client_s = sum(waits) / len(waits)
        near = max(0.1 * client_s, 0.005)
        assert abs(shown.sample.ttft_s - client_s) <= near, (shown.sample.ttft_s, waits)
    finally:
        run.stop()
        await asyncio.wait_for(task, 60)

    # `plan` beside it (prepare with dry_run, as the command calls it) reads the verdict.
    planned = pipeline.prepare(paths, options, lambda event: None, dry_run=True).launch
    choice = planned.engine_choice
    assert choice is not None and choice.measured and planned.engine_kind == faster
    assert "measured on this card" in choice.reason and "tok/s" in choice.reason
