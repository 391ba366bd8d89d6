"""A generated text model and its generated LLaVA projector served by `lucebox serve --mmproj`
on the real CPU llama-server, sent an image through the official `openai` SDK (a data URI and
an http URL the engine fetches) and the official `anthropic` SDK (an ``image`` block)."""

from __future__ import annotations

import base64
import json
import os
import re
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from anthropic.types import MessageParam
from textual.widgets import Label, Static

from lucebox.app.tui.app import LuceboxApp
from lucebox.app.tui.backend import Backend
from lucebox.app.tui.screens.dashboard import DashboardScreen
from lucebox.app.tui.screens.quit import QuitModal
from lucebox.app.tui.widgets.chat import ChatPanel
from lucebox.engine.bench.compare import ServeConfig, serving
from lucebox.engine.core.paths import Paths, resolve_paths
from lucebox.engine.pipeline import ServeOptions
from lucebox.engine.run.runstate import engine_log
from support.ggufgen import ModelSpec, ProjectorSpec, write_gguf
from support.httpserver import Route, serve_files
from support.pngimage import png
from support.ports import free_port
from support.smolserver import private_engine_home
from tests.app.tui.scripted import wait_until
from tests.conftest import alive, run_lucebox

pytestmark = pytest.mark.slow

PROJECTOR = ProjectorSpec()
IMAGE_TOKENS = (PROJECTOR.image_size // PROJECTOR.patch_size) ** 2
"""What the llava graph makes of an image: one embedding per patch (the class token dropped)."""


def test_an_image_through_the_openai_sdk_is_encoded_by_the_served_projector(
    built_engine_home, tmp_path: Path
):
    home = private_engine_home(tmp_path / "home")
    model = write_gguf(tmp_path / "tiny-vision.gguf", ModelSpec())
    projector = write_gguf(tmp_path / "mmproj-tiny-vision-F16.gguf", PROJECTOR)
    paths = resolve_paths({"LUCEBOX_HOME": str(home)})
    options = ServeOptions(model=str(model), mmproj=str(projector), ctx=2048)
    env = {**os.environ, "LUCEBOX_HOME": str(home)}
    with (
        serving(paths, options, ServeConfig("vision"), env=env, ready_timeout_s=300) as served,
        openai.OpenAI(base_url=f"{served.url}/v1", api_key="none", max_retries=0) as client,
        anthropic.Anthropic(base_url=served.url, api_key="none", max_retries=0) as anthropic_client,
    ):
        uri = "data:image/png;base64," + base64.b64encode(png()).decode()
        text = {"type": "text", "text": "What is in this picture?"}
        image = {"type": "image_url", "image_url": {"url": uri}}
        seen = client.chat.completions.create(
            model=served.model or "any",
            messages=[{"role": "user", "content": [text, image]}],  # type: ignore[misc,list-item]
            max_tokens=4,
            temperature=0,
        )
        plain = client.chat.completions.create(
            model=served.model or "any",
            messages=[{"role": "user", "content": [text]}],  # type: ignore[misc,list-item]
            max_tokens=4,
            temperature=0,
        )
        # Anthropic `image` blocks: the pinned llama-server's /v1/messages converts them itself.
        data = base64.b64encode(png()).decode()
        asked: MessageParam = {
            "role": "user",
            "content": [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": data},
                },
                {"type": "text", "text": "What is in this picture?"},
            ],
        }
        message = anthropic_client.messages.create(
            model=served.model or "any",
            max_tokens=4,
            extra_body={"temperature": 0},
            messages=[asked],
        )
        # An http URL a client names is fetched by the engine itself (handle_media): on
        # loopback the plan serves it; off loopback it waits for model.image_urls.
        with serve_files({"/picture.png": Route(png(), "image/png")}) as files:
            by_url = {"type": "image_url", "image_url": {"url": f"{files.base_url}/picture.png"}}
            fetched = client.chat.completions.create(
                model=served.model or "any",
                messages=[{"role": "user", "content": [text, by_url]}],  # type: ignore[misc,list-item]
                max_tokens=4,
                temperature=0,
            )
            fetches = [r for r in files.requests if r[1] == "/picture.png"]
        status = _status_after_image(env)
        assert served.engine_log is not None
        log = served.engine_log.read_text(errors="replace")
    assert status["vision"] == {"served": True, "projector": str(projector)}
    # The last request (an image) timed like any other: its image tokens are prompt.
    assert status["sample"]["last_ttft_s"] > 0
    # Anthropic's input_tokens leaves out the prompt read from the cache.
    assert plain.usage is not None
    usage = message.usage
    anthropic_prompt = usage.input_tokens + (usage.cache_read_input_tokens or 0)
    assert message.content and anthropic_prompt - plain.usage.prompt_tokens >= IMAGE_TOKENS
    assert fetched.usage is not None and fetches
    assert fetched.usage.prompt_tokens - plain.usage.prompt_tokens >= IMAGE_TOKENS
    assert "downloading image from" in log
    assert seen.choices[0].message.content is not None
    assert seen.usage is not None and plain.usage is not None
    # The image became the projector's embeddings: one prompt position per patch.
    assert seen.usage.prompt_tokens - plain.usage.prompt_tokens >= IMAGE_TOKENS
    assert f"loaded multimodal model, '{projector}'" in log


def _status_after_image(env: dict[str, str]) -> dict:
    """``lucebox status --json`` once the sampler has seen the last request finish."""
    deadline_s = time.monotonic() + 30
    while True:
        done = run_lucebox("status", "--json", env=env)
        status = json.loads(done.stdout)
        sample = status.get("sample") or {}
        if sample.get("last_ttft_s") or time.monotonic() > deadline_s:
            return status
        time.sleep(0.5)


async def test_the_tui_chat_attaches_an_image_by_path(built_engine_home, tmp_path: Path):
    home = private_engine_home(tmp_path / "home")
    model = write_gguf(tmp_path / "tiny-vision.gguf", ModelSpec())
    projector = write_gguf(tmp_path / "mmproj-tiny-vision-F16.gguf", PROJECTOR)
    picture = tmp_path / "picture.png"
    picture.write_bytes(png())
    paths = resolve_paths({"LUCEBOX_HOME": str(home)})
    app = LuceboxApp(
        Backend(paths),
        ServeOptions(model=str(model), mmproj=str(projector), port=free_port(), ctx=2048),
    )
    async with app.run_test(size=(120, 40)) as pilot:

        def ready() -> bool:
            screen = app.screen
            return isinstance(screen, DashboardScreen) and screen.state == "ready"

        await wait_until(pilot, ready, timeout_s=300)
        dashboard = app.screen
        assert isinstance(dashboard, DashboardScreen) and app.supervisor is not None
        header = dashboard.query_one("#dash-header", Static)
        await wait_until(pilot, lambda: "· vision" in str(header.render()))
        await pilot.press("c", *f"/image {tmp_path / 'missing.png'}", "enter")
        chat = dashboard.query_one(ChatPanel)
        stats = chat.query_one("#chat-stats", Label)
        assert "does not exist" in str(stats.render()) and chat.attached is None
        await pilot.press(*f"/image {picture}", "enter")
        assert "image attached: picture.png" in str(stats.render())
        await pilot.press(*"What is this?", "enter")
        await wait_until(pilot, lambda: chat.messages[-1]["role"] == "assistant", timeout_s=120)
        sent = chat.messages[-2]["content"]
        assert [part["type"] for part in sent] == ["text", "image_url"]
        assert chat.attached is None
        # The engine read the image: its first prompt is the same text's plus the image's tokens.
        (with_image, *_) = _prompts_read(paths)
        async with httpx.AsyncClient(timeout=60) as client:
            reply = await client.post(
                f"{dashboard.url}/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "What is this?"}], "max_tokens": 1,
                      "cache_prompt": False},
            )  # fmt: skip
        text_only = reply.json()["usage"]["prompt_tokens"]
        assert with_image - text_only >= IMAGE_TOKENS
        engine_pid = app.supervisor.pid
        await pilot.press("escape", "q")
        await wait_until(pilot, lambda: isinstance(app.screen, QuitModal))
        await pilot.press("s")
        await wait_until(pilot, lambda: engine_pid is None or not alive(engine_pid), timeout_s=60)


def _prompts_read(paths: Paths) -> list[int]:
    """The prompt tokens the engine read for each request, as its log times them."""
    text = engine_log(paths).read_text(errors="replace")
    return [int(n) for n in re.findall(r"prompt eval time = +[\d.]+ ms / +(\d+) tokens", text)]
