"""Codex's model list (``GET /v1/models?client_version=...``) through lucebox's front on both
engines: `lucebox serve` of SmolLM2 on the suite's built llama-server, and the Lucebox engine's
recorded-contract stand-in (support/luceboxfake.py, installed as a build) serving a generated
qwen35 target, whose plan has thinking off. The document must have every field Codex requires
(support/codexlist.py says where the list comes from) and the real Codex CLI must read it.

Codex 0.169.0 itself does not ask a custom provider for this list (run against a logging server,
``codex exec`` and ``codex debug models`` only POST ``/v1/responses``), so the real client reads
the document lucebox served as its ``model_catalog_json``: the same ``ModelsResponse`` parser.
"""

from __future__ import annotations

import asyncio
import os
import shutil

import httpx
import pytest

from lucebox.engine import pipeline, runstart
from lucebox.engine.bench.compare import Served
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.machine import gpu
from lucebox.engine.plan.options import ServeOptions
from lucebox.engine.run.supervision.serverevent import ServerEvent
from support import codexlist
from support.agentinstall import ClientsUnavailableError, client_bin_dirs
from support.ggufgen import cached_gguf, qwen35_target
from support.ports import free_port
from support.smolserver import private_engine_home
from tests.e2e.test_engine_choice_on_auto import H100, _install_stand_in
from tests.engine.fake_nvml import FakeNvml

pytestmark = pytest.mark.slow

CODEX_ASKS = "/v1/models?client_version=0.169.0"


def codex_binary() -> str:
    """The real Codex CLI (support/agentinstall.py); skips, saying why, where it is absent."""
    try:
        dirs = client_bin_dirs()
    except ClientsUnavailableError as exc:
        pytest.skip(f"the real Codex CLI is not installable here: {exc}")
    found = shutil.which("codex", path=os.pathsep.join(map(str, dirs)))
    if found is None:
        pytest.skip("the npm clients installed without a codex command")
    return found


def test_codex_gets_its_own_list_from_llama_server_and_reads_it(smol_server: Served, tmp_path):
    listed = httpx.get(f"{smol_server.url}{CODEX_ASKS}", headers=smol_server.headers(), timeout=30)
    assert listed.status_code == 200, listed.text
    document = listed.json()
    assert codexlist.problems(document) == []
    (model,) = document["models"]
    assert model["slug"] == smol_server.model and model["context_window"] == 4096
    assert "default_reasoning_level" not in model  # SmolLM2's plan says no default
    plain = httpx.get(f"{smol_server.url}/v1/models", headers=smol_server.headers(), timeout=30)
    assert plain.json()["object"] == "list"  # every other client still gets OpenAI's list
    read = codexlist.codex_reads(codex_binary(), document, tmp_path)
    assert [(m["slug"], m["context_window"]) for m in read["models"]] == [(model["slug"], 4096)]


def test_the_real_codex_refuses_a_list_without_its_fields(tmp_path):
    """The Codex check above can fail: the Lucebox engine's own answer lacks required fields."""
    engine_own = {"models": [{"slug": "m", "display_name": "m", "priority": 1}]}
    with pytest.raises(AssertionError, match="missing field"):
        codexlist.codex_reads(codex_binary(), engine_own, tmp_path)


async def test_codex_gets_its_own_list_on_the_lucebox_engine(
    built_engine_home, tmp_path, monkeypatch
):
    home = private_engine_home(tmp_path / "home")
    monkeypatch.setenv("LUCEBOX_HOME", str(home))
    requests = tmp_path / "requests.txt"
    monkeypatch.setenv("FAKE_REQUESTS", str(requests))
    monkeypatch.setattr(gpu, "PynvmlProvider", lambda: FakeNvml(gpus=[H100]))
    paths = resolve_paths({"LUCEBOX_HOME": str(home)})
    _install_stand_in(paths)
    options = ServeOptions(
        model=str(cached_gguf(qwen35_target(mtp=False))), engine="lucebox", port=free_port()
    )
    prepared = pipeline.prepare(paths, options, lambda event: None)
    assert prepared.launch.engine_kind == "lucebox"
    run = runstart.server_run(paths, prepared, runstart.new_supervisor(paths, prepared))
    listed: httpx.Response | None = None
    async for item in run.events():
        if isinstance(item, ServerEvent) and item.kind == "ready":
            listed = await asyncio.to_thread(httpx.get, run.public_url + CODEX_ASKS, timeout=30)
            run.stop()
    assert listed is not None and listed.status_code == 200, listed
    document = listed.json()
    assert codexlist.problems(document) == []
    (model,) = document["models"]
    assert model["slug"] == prepared.launch.alias
    assert model["default_reasoning_level"] == "none"  # the plan keeps thinking off here
    asked = requests.read_text().splitlines()
    assert not any("client_version" in line for line in asked), asked  # never the engine's
