"""An embedding model beside the Lucebox engine: the chat engine is the recorded-contract
stand-in (support/luceboxfake.py; the real one needs an NVIDIA GPU) installed as a Lucebox build,
NVML the scripted provider showing one H100, and the embedding model the real MiniLM served by
the suite's CPU llama-server, reached through the same front the Lucebox engine is behind.
The GPU run of the real engine is benchmarks/device/drive.sh's ``embeddings`` step."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import pytest

from lucebox.engine import pipeline, runstart
from lucebox.engine.core.paths import Paths, resolve_paths
from lucebox.engine.core.units import GIB
from lucebox.engine.machine import config, gpu
from lucebox.engine.plan.options import ServeOptions
from lucebox.engine.run import runstate
from support.bertgguf import minilm_model
from support.ggufgen import LuceboxDFlashSpec, cached_gguf, qwen35_target
from support.luceboxfake import __file__ as FAKE
from support.ports import free_port
from support.smolserver import private_engine_home
from tests.e2e.test_embeddings_e2e import GUITAR, PARAPHRASE, UNRELATED, cosine
from tests.e2e.test_enginecalibration import until
from tests.engine.builds import lucebox_build
from tests.engine.fake_nvml import FakeGpu, FakeNvml

pytestmark = pytest.mark.slow

H100 = FakeGpu(name="NVIDIA H100 80GB HBM3", total_bytes=80 * GIB, capability=(9, 0))


def _install_stand_in(paths: Paths) -> None:
    manifest = lucebox_build(paths, "4cf58a04", "2026-12-06T00:00:00Z")
    server = Path(manifest.server_path)
    server.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE} "$@"\n')
    server.chmod(0o755)


async def _embedded(url: str) -> list[list[float]]:
    """The three sentences' vectors once the side model answers."""
    async with httpx.AsyncClient(timeout=30) as client:
        for _ in range(120):
            answer = await client.post(
                f"{url}/v1/embeddings", json={"input": [GUITAR, PARAPHRASE, UNRELATED]}
            )
            if answer.status_code == 200:
                return [item["embedding"] for item in answer.json()["data"]]
            await asyncio.sleep(0.5)
    raise AssertionError(f"no embeddings: {answer.status_code} {answer.text}")


async def test_embeddings_beside_the_lucebox_engine(built_engine_home, tmp_path, monkeypatch):
    home = private_engine_home(tmp_path / "home")
    monkeypatch.setenv("LUCEBOX_HOME", str(home))
    monkeypatch.setenv("FAKE_REQUESTS", str(tmp_path / "requests.txt"))
    paths = resolve_paths({"LUCEBOX_HOME": str(home)})
    config.set_setting(paths, "server.port", str(free_port()))
    config.set_setting(paths, "embeddings.model", str(minilm_model()))
    _install_stand_in(paths)
    monkeypatch.setattr(gpu, "PynvmlProvider", lambda: FakeNvml(gpus=[H100]))
    target = cached_gguf(qwen35_target(mtp=False))
    draft = cached_gguf(LuceboxDFlashSpec())
    options = ServeOptions(model=str(target), draft=str(draft), engine="lucebox")

    prepared = pipeline.prepare(paths, options, lambda event: None)
    assert prepared.launch.engine_kind == "lucebox"
    (side,) = prepared.launch.sides.models
    assert side.on_gpu and side.memory_bytes > side.weights_bytes
    run = runstart.server_run(paths, prepared, runstart.new_supervisor(paths, prepared))

    async def consume() -> None:
        async for _ in run.events():
            pass

    task = asyncio.create_task(consume())
    try:
        await until(lambda: run.status.state == "ready", 120, lambda: run.status)
        guitar, paraphrase, unrelated = await _embedded(run.public_url)
        assert cosine(guitar, paraphrase) > cosine(guitar, unrelated) + 0.3
        async with httpx.AsyncClient(timeout=30) as client:
            listed = (await client.get(f"{run.public_url}/v1/models")).json()["data"]
        assert {"embeddings"} <= {m.get("type") for m in listed}
        shown = {"role": "embeddings", "alias": side.alias, "ready": True, "restarts": 0}

        def status_shows_it() -> bool:
            status = runstate.read_status(paths)
            return status is not None and status.to_json()["side_models"] == [shown]

        await until(status_shows_it, 30, lambda: runstate.read_status(paths))
        seen = tmp_path / "requests.txt"
        # The stand-in logs its argv and then one line per request it got.
        asked = (seen.read_text() if seen.exists() else "").splitlines()
        requests = [line for line in asked if not line.startswith("ARGV ")]
        assert requests and not any("embedding" in line for line in requests), requests
    finally:
        run.stop()
        await asyncio.wait_for(task, 60)
