"""The chat page on the Lucebox engine: lucebox's front serves llama.cpp's web UI (the bundle of
the suite's real llama.cpp build) and answers the calls the page makes at start, in front of the
recorded-contract stand-in for the engine (support/luceboxfake.py)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from lucebox.engine import runstart
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.engines import uibundle, webui
from lucebox.engine.plan.samplingdefaults import SamplingDefaults
from lucebox.engine.run.front.chatpage import ChatPage, PageFacts, page_api, page_file
from lucebox.engine.run.runsetup import RunFacts
from lucebox.engine.run.serverrun.serverrun import ServerRun
from lucebox.engine.run.supervision.serverevent import ServerEvent
from lucebox.engine.run.supervisor import Supervisor
from support.chatpage import page_checks, page_session
from support.ports import free_port
from tests.engine.run.test_luceboxserve import lucebox_spec

KEY = "sk-page-test"
SAMPLING = SamplingDefaults(0.6, 0.95, 20, 0.0, "preset")


@pytest.fixture(scope="module")
def ui_folder(built_engine_home: Path) -> Path:
    bundle = uibundle.find_bundle(resolve_paths({"LUCEBOX_HOME": str(built_engine_home)}))
    assert bundle.folder is not None, bundle.why_none
    return bundle.folder


def test_a_path_outside_the_bundle_finds_nothing(tmp_path):
    (tmp_path / "ui").mkdir()
    (tmp_path / "ui" / "index.html").write_text("<html>")
    (tmp_path / "secret.txt").write_text("no")
    assert page_file(tmp_path / "ui", "/") == (b"<html>", "text/html; charset=utf-8")
    assert page_file(tmp_path / "ui", "/../secret.txt") is None
    assert page_file(tmp_path / "ui", "/missing.js") is None


def test_props_say_the_planned_model_context_defaults_and_images():
    facts = PageFacts("qwen", 8192, images=False, sampling=SAMPLING)
    props = json.loads(page_api("GET", "/props", facts) or b"")
    settings = props["default_generation_settings"]
    assert (settings["n_ctx"], settings["params"]["temperature"]) == (8192, 0.6)
    assert props["role"] == "model" and props["modalities"]["vision"] is False
    assert props["model_alias"] == "qwen"
    assert page_api("POST", "/v1/chat/completions", facts) is None


def test_no_bundle_says_why(tmp_path):
    bundle = uibundle.find_bundle(resolve_paths({"LUCEBOX_HOME": str(tmp_path)}))
    assert bundle.folder is None and "lucebox engine build" in bundle.why_none


async def test_the_page_loads_and_chats_on_the_lucebox_engine(tmp_path, monkeypatch, ui_folder):
    monkeypatch.setenv("FAKE_REQUESTS", str(tmp_path / "requests.txt"))
    spec = replace(lucebox_spec(tmp_path), engine_port=free_port())
    supervisor = Supervisor(spec, tmp_path / "engine.log", ready_timeout_s=20)
    facts = RunFacts(
        model="tiny",
        gpu_index=0,
        api_key=KEY,
        sampling=SAMPLING,
        chat_page=ChatPage(ui_folder, answers_api=True),
    )
    run = ServerRun(resolve_paths(), supervisor, facts)
    seen: dict[str, httpx.Response] = {}
    async with asyncio.timeout(90):
        async for item in run.events():
            if isinstance(item, ServerEvent) and item.kind == "ready":
                seen = await page_session(run.public_url, KEY)
                run.stop()
    checks = page_checks(seen, ctx=4096)
    assert [name for name, ok in checks.items() if not ok] == []
    props = seen["/props"].json()
    assert props["model_alias"] == "tiny"
    assert props["default_generation_settings"]["params"]["temperature"] == 0.6
    assert seen["/v1/models"].json()["data"][0]["id"] == "tiny"
    assert seen["/slots"].json()[0]["n_ctx"] == 4096
    assert seen["/tools"].json() == []


def test_the_front_serves_the_page_only_for_an_engine_without_one(tmp_path, built_engine_home):
    paths = resolve_paths({"LUCEBOX_HOME": str(built_engine_home)})
    lucebox = lucebox_spec(tmp_path)
    page = runstart.chat_page(paths, lucebox)
    assert page.front_page is not None and page.front_page.answers_api
    assert page.url(lucebox) == f"http://127.0.0.1:{lucebox.port}/"
    with_ui = tmp_path / "llama-server"
    with_ui.write_bytes(b"\x7fELF" + webui.ASSET_MARKER)
    own = runstart.chat_page(paths, replace(lucebox, server_path=str(with_ui), kind="llama-server"))
    assert own.served and own.front_page is None
    none = runstart.chat_page(resolve_paths({"LUCEBOX_HOME": str(tmp_path)}), lucebox)
    assert none.url(lucebox) is None and "lucebox engine build" in none.why_none
