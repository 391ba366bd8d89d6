"""The engine's web UI in a real browser: headless Chromium asks the real instruct model.

`lucebox serve` runs the CPU engine built by our build code (with its web UI) serving
SmolLM2-135M-Instruct; Debian's Chromium, driven by Playwright for Python, loads the page the
status names, sends a question and waits for the answer to appear. Screenshots of the answered
chats are kept in ``test-artifacts/`` of the checkout.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from support.ggufgen import ModelSpec, ProjectorSpec, write_gguf
from support.pngimage import png
from support.ports import free_port
from support.realmodels import smol_model
from support.smolserver import no_calibration
from tests.conftest import run_lucebox

pytestmark = pytest.mark.slow

ARTIFACTS_DIR = Path(__file__).resolve().parents[2] / "test-artifacts"
QUESTION = "What is the capital of France? Answer in one short sentence."
API_KEY = "lb-browser-test-key"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
ANSWER_TIMEOUT_MS = 240_000


def _chromium() -> str:
    for candidate in ("chromium", "chromium-browser"):
        found = shutil.which(candidate)
        if found:
            return found
    pytest.skip(
        "no Chromium on PATH: install Debian's `chromium` package "
        "(scripts/test does so where it runs as root with apt-get)"
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="Playwright for Python is not installed (pip playwright)"
    )
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=_chromium(), args=CHROMIUM_FLAGS)
        yield launched
        launched.close()


def _lucebox_env(home: Path) -> dict[str, str]:
    return {**os.environ, "LUCEBOX_HOME": str(home)}


def _status(home: Path) -> dict[str, Any]:
    done = run_lucebox("status", "--json", env=_lucebox_env(home))
    return dict(json.loads(done.stdout))


@pytest.fixture
def serve(built_engine_home, tmp_path) -> Iterator[Any]:
    """Start `lucebox serve` of the instruct model in its own home; yields its status."""
    built = run_lucebox("engine", "build", "--cpu", "--json", env=_lucebox_env(built_engine_home))
    engine = json.loads(built.stdout)
    assert engine["cached"] and engine["webui"] and engine["rpc"], engine
    server = engine["server_path"]
    procs: list[subprocess.Popen[str]] = []

    def start(host: str, api_key: str | None = None, model: tuple[str, ...] = ()) -> dict[str, Any]:
        """Serve SmolLM2, or the ``--model ...`` arguments ``model`` names."""
        # A home of its own, so the API key set here never reaches other tests' servers; the
        # engine is the one the suite built, registered in place.
        home = tmp_path / f"home-{len(procs)}"
        added = run_lucebox("engine", "add", server, env=_lucebox_env(home))
        assert added.returncode == 0, added.stderr
        no_calibration(home)  # a calibration's restart would cut the page's request
        if api_key:
            done = run_lucebox("config", "set", "server.api_key", api_key, env=_lucebox_env(home))
            assert done.returncode == 0, done.stderr
        served = model or ("--model", str(smol_model()))
        argv = [sys.executable, "-m", "lucebox.app.cli", "serve", *served]
        argv += ["--host", host, "--port", str(free_port()), "--ctx", "2048"]
        proc = subprocess.Popen(
            argv,
            env=_lucebox_env(home),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        procs.append(proc)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            status = _status(home)
            if status["state"] == "ready":
                return status
            if proc.poll() is not None:
                raise AssertionError(proc.stdout.read() if proc.stdout else "serve exited")
            time.sleep(0.5)
        raise AssertionError(f"not ready in time: {_status(home)}")

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        if proc.stdout is not None:
            proc.stdout.close()


def _streamed_text(sse_body: str) -> str:
    """The assistant's words from an OpenAI-style SSE body."""
    parts = []
    for line in sse_body.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for choice in json.loads(line[6:]).get("choices") or []:
                parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


def _send(page: Any, question: str) -> Any:
    """Type ``question`` into the chat box and send it; the engine's answer (status 200)."""
    box = page.locator("textarea, [contenteditable='true']").first
    box.wait_for(state="visible", timeout=60_000)
    box.click()
    box.fill(question)
    with page.expect_response(
        lambda r: r.url.endswith("/chat/completions") and r.request.method == "POST",
        timeout=ANSWER_TIMEOUT_MS,
    ) as answered:
        box.press("Enter")
    response = answered.value
    assert response.status == 200, response.text()
    return response


def _ask(page: Any, question: str) -> Any:
    """Send ``question`` and wait for the answer's words on the page."""
    response = _send(page, question)
    answer = _streamed_text(response.text())
    words = re.findall(r"[A-Za-z]{3,}", answer)[:8]
    assert words, f"the model answered no words: {answer!r}"
    page.wait_for_function(
        "words => words.every(w => document.body.innerText.includes(w))",
        arg=words,
        timeout=ANSWER_TIMEOUT_MS,
    )
    return response


def _screenshot(page: Any, name: str) -> Path:
    ARTIFACTS_DIR.mkdir(exist_ok=True)
    path = ARTIFACTS_DIR / name
    page.screenshot(path=str(path), full_page=True)
    return path


def test_the_served_page_answers_a_question(serve, browser):
    status = serve("127.0.0.1")
    assert status["webui_url"] == f"{status['url']}/"
    context = browser.new_context(service_workers="block", viewport={"width": 1280, "height": 800})
    try:
        page = context.new_page()
        page.goto(status["webui_url"])
        _ask(page, QUESTION)
        assert QUESTION in page.locator("body").inner_text()
        shot = _screenshot(page, "webui-chat-loopback.png")
        assert shot.stat().st_size > 10_000
    finally:
        context.close()


def test_off_loopback_the_page_asks_for_the_key_and_chats_with_it(serve, browser):
    status = serve("0.0.0.0", api_key=API_KEY)
    url = status["webui_url"]
    assert url.endswith(f":{status['url'].rsplit(':', 1)[1]}/")
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    assert httpx.post(f"{url}v1/chat/completions", json=chat, timeout=30).status_code == 401
    assert httpx.get(url, timeout=30).status_code == 200  # the page itself needs no key
    context = browser.new_context(service_workers="block", viewport={"width": 1280, "height": 800})
    try:
        page = context.new_page()
        page.goto(url)
        enter_key = page.get_by_role("button", name="Enter API Key")
        enter_key.wait_for(state="visible", timeout=60_000)
        from_page = page.evaluate(
            """chat => fetch('v1/chat/completions', {
                method: 'POST', headers: {'Content-Type': 'application/json'},
                body: JSON.stringify(chat)}).then(r => r.status)""",
            chat,
        )
        assert from_page == 401
        _screenshot(page, "webui-key-prompt.png")
        enter_key.click()
        page.locator("#api-key-input").fill(API_KEY)
        page.locator("#api-key-input").press("Enter")
        response = _ask(page, QUESTION)
        assert response.request.all_headers().get("authorization") == f"Bearer {API_KEY}"
        _screenshot(page, "webui-chat-with-key.png")
    finally:
        context.close()


def test_the_page_sends_an_image_that_the_served_projector_reads(serve, browser, tmp_path):
    model = write_gguf(tmp_path / "tiny-vision.gguf", ModelSpec())
    projector_spec = ProjectorSpec()
    projector = write_gguf(tmp_path / "mmproj-tiny-vision-F16.gguf", projector_spec)
    picture = tmp_path / "picture.png"
    picture.write_bytes(png())
    status = serve("127.0.0.1", model=("--model", str(model), "--mmproj", str(projector)))
    assert status["vision"] == {"served": True, "projector": str(projector)}
    context = browser.new_context(service_workers="block", viewport={"width": 1280, "height": 800})
    try:
        page = context.new_page()
        page.goto(status["webui_url"])
        # The page offers attachments once the server's /props says it sees images.
        page.locator("input[type=file]").set_input_files(str(picture))
        response = _send(page, "What is in this picture?")
        sent = response.request.post_data_json["messages"][-1]["content"]
        assert [part["type"] for part in sent] == ["image_url", "text"]
        assert sent[0]["image_url"]["url"].startswith("data:image/png;base64,")
        timings = [
            json.loads(line[6:])["timings"]
            for line in response.text().splitlines()
            if line.startswith("data: ") and '"timings"' in line
        ]
        _screenshot(page, "webui-image-sent.png")
    finally:
        context.close()
    # The image became the projector's embeddings: the prompt is the question's alone (asked
    # again without the image) plus one position per patch.
    messages = response.request.post_data_json["messages"]
    text_only = [*messages[:-1], {"role": "user", "content": [sent[1]]}]
    body = {"messages": text_only, "max_tokens": 1, "cache_prompt": False}
    alone = httpx.post(f"{status['url']}/v1/chat/completions", json=body, timeout=60).json()
    patches = (projector_spec.image_size // projector_spec.patch_size) ** 2
    assert timings and timings[-1]["prompt_n"] - alone["usage"]["prompt_tokens"] >= patches
