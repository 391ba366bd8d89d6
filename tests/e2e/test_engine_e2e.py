"""The real engine: built by `lucebox engine build --cpu`, then serving the real Gemma 3 270M.

The first run builds for about 9 minutes on 2 cores; the engine is cached in the user cache
dir (support/realmodels.py), so later runs take seconds.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import time
from pathlib import Path

import httpx
import pytest

from support.health import wait_healthy
from support.httpserver import Route, serve_files
from support.ports import free_port
from support.realmodels import engine_home, gemma_model
from tests.conftest import assert_one_line_error, run_lucebox

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def built_engine() -> dict:
    env = {"LUCEBOX_HOME": str(engine_home())}
    source = run_lucebox("engine", "source", env=env, timeout_s=600)
    assert source.returncode == 0, source.stderr
    build = run_lucebox("engine", "build", "--cpu", "--json", env=env, timeout_s=3600)
    assert build.returncode == 0, build.stderr
    return json.loads(build.stdout)


def test_second_build_is_cached_and_fast(built_engine):
    started = time.monotonic()
    again = run_lucebox(
        "engine", "build", "--cpu", "--json", env={"LUCEBOX_HOME": str(engine_home())}
    )
    elapsed_s = time.monotonic() - started
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["cached"] is True
    assert elapsed_s < 10


def test_status_lists_capabilities_read_from_the_engine(built_engine):
    status = json.loads(
        run_lucebox("engine", "status", "--json", env={"LUCEBOX_HOME": str(engine_home())}).stdout
    )
    assert status["selected"] == built_engine["id"]
    (engine,) = [e for e in status["engines"] if e["id"] == built_engine["id"]]
    assert engine["backend"] == "cpu"
    assert {"draft-dflash", "draft-mtp", "draft-simple"} <= set(engine["spec_types"])
    assert {"f16", "q8_0", "q4_0"} <= set(engine["kv_cache_types"])
    assert {"llama", "gemma3", "qwen2"} <= set(engine["model_archs"])
    path = run_lucebox("engine", "path", env={"LUCEBOX_HOME": str(engine_home())})
    assert path.stdout.strip() == engine["server_path"]


def test_every_build_has_the_web_ui_and_the_rpc_server(built_engine):
    assert built_engine["webui"] is True, built_engine["webui_detail"]
    assert built_engine["webui_detail"].startswith("built from the engine source with ")
    assert built_engine["rpc"] is True
    rpc_server = Path(built_engine["server_path"]).with_name("ggml-rpc-server")
    done = subprocess.run(
        [str(rpc_server), "--help"], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0 and "--port" in done.stderr
    env = {"LUCEBOX_HOME": str(engine_home())}
    status = json.loads(run_lucebox("engine", "status", "--json", env=env).stdout)
    (engine,) = [e for e in status["engines"] if e["id"] == built_engine["id"]]
    assert engine["webui"] is True and engine["rpc"] is True
    checks = {
        c["name"]: c for c in json.loads(run_lucebox("doctor", "--json", env=env).stdout)["checks"]
    }
    assert checks["webui"]["verdict"] == "ok"


def test_version_names_the_pinned_build(built_engine):
    done = subprocess.run(
        [built_engine["server_path"], "--version"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert "build 11434" in done.stdout + done.stderr


def test_short_completion_on_the_real_gemma(built_engine):
    port = free_port()
    proc = subprocess.Popen(
        [
            built_engine["server_path"],
            "-m",
            str(gemma_model()),
            "--chat-template",
            "gemma",
            "-c",
            "2048",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-t",
            "2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, 120, proc)
        reply = httpx.post(
            f"{url}/v1/chat/completions",
            timeout=120,
            json={"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16},
        ).json()
        assert reply["usage"]["completion_tokens"] > 0
        assert reply["choices"][0]["message"]["content"].strip()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _engine_tarball(server_path: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(server_path, arcname="lucebox-engine/bin/llama-server")
    return buffer.getvalue()


def test_fetch_a_prebuilt_engine(built_engine, lucebox_home):
    body = _engine_tarball(built_engine["server_path"])
    good_sha = hashlib.sha256(body).hexdigest()
    routes = {"/good.tar.gz": Route(body), "/cut.tar.gz": Route(body, cut_after_bytes=1000)}
    with serve_files(routes) as server:
        wrong = run_lucebox(
            "engine", "fetch", f"{server.base_url}/good.tar.gz", "--sha256", "0" * 64
        )
        assert wrong.returncode == 3 and "sha256" in wrong.stderr  # HashMismatchError
        assert_one_line_error(wrong)
        missing = run_lucebox(
            "engine", "fetch", f"{server.base_url}/nope.tar.gz", "--sha256", good_sha
        )
        assert missing.returncode == 1 and "404" in missing.stderr
        assert json.loads(run_lucebox("engine", "status", "--json").stdout)["engines"] == []
        # A connection cut mid-file resumes within the same run (download retries).
        cut = run_lucebox("engine", "fetch", f"{server.base_url}/cut.tar.gz", "--sha256", good_sha)
        assert cut.returncode == 0 and "attempt 2" in cut.stderr, cut.stderr
    status = json.loads(run_lucebox("engine", "status", "--json").stdout)
    (engine,) = status["engines"]
    assert engine["origin"] == "fetch" and "draft-dflash" in engine["spec_types"]
    # The UI is read from the binary; the tarball carries no ggml-rpc-server.
    assert engine["webui"] is True and engine["rpc"] is False
    assert Path(engine["server_path"]).is_file()


def test_add_an_existing_llama_server(built_engine, tmp_path):
    added = run_lucebox("engine", "add", built_engine["server_path"])
    assert added.returncode == 0, added.stderr
    (engine,) = json.loads(run_lucebox("engine", "status", "--json").stdout)["engines"]
    assert engine["origin"] == "add" and engine["server_path"] == built_engine["server_path"]
    assert engine["webui"] is True and engine["rpc"] is True
    not_server = tmp_path / "not-a-server"
    not_server.write_text("#!/bin/sh\necho hi\n")
    not_server.chmod(0o755)
    refused = run_lucebox("engine", "add", str(not_server))
    assert refused.returncode == 1
    assert_one_line_error(refused)
