"""The engine's web UI: found in the binary, the reason a build went without it, its URL."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.engines import install, uibundle, webui
from lucebox.engine.engines.registry import list_engines
from lucebox.engine.engines.source import ensure_source
from support.ports import free_port
from support.uibuild import ui_assets_argv


def test_has_webui_reads_the_binary(tmp_path):
    with_ui = tmp_path / "with-ui"
    with_ui.write_bytes(b"\x7fELF" + b"\0" * 4096 + b"_app/version.json\0" + b"\0" * 64)
    without = tmp_path / "without"
    without.write_bytes(b"\x7fELF" + b"\0" * 4096 + b"index.html\0sw.js\0")
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert webui.has_webui(with_ui)
    assert not webui.has_webui(without)
    assert not webui.has_webui(empty)
    assert not webui.has_webui(tmp_path / "missing")


def test_webui_url_loopback_wildcard_and_ipv6(monkeypatch):
    assert webui.webui_url("127.0.0.1", 8080) == "http://127.0.0.1:8080/"
    assert webui.webui_url("::1", 8080) == "http://[::1]:8080/"
    monkeypatch.setattr(webui, "lan_address", lambda: "192.168.1.20")
    assert webui.webui_url("0.0.0.0", 8080) == "http://192.168.1.20:8080/"
    monkeypatch.setattr(webui, "lan_address", lambda: None)
    assert webui.webui_url("0.0.0.0", 8080) == "http://127.0.0.1:8080/"


def test_lan_address_is_never_loopback():
    address = webui.lan_address()
    assert address is None or not address.startswith("127.")


@pytest.fixture(scope="module")
def pinned_source(tmp_path_factory) -> Path:
    """The pinned engine source (deps/llama.cpp, filled from PyPI's cache when missing)."""
    home = tmp_path_factory.mktemp("source-home")
    return ensure_source(resolve_paths({"LUCEBOX_HOME": str(home)})).path


def _ui_assets(source: Path, binary_dir: Path, path: str, **env: str) -> str:
    """Run the source's own UI provisioning script as the engine build runs it."""
    done = subprocess.run(
        ui_assets_argv(source, binary_dir),
        env={**os.environ, "PATH": path, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr  # a UI that cannot be built never fails the build
    return done.stdout + done.stderr


@pytest.mark.slow
def test_no_npm_is_named_as_the_reason(pinned_source, tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    log = _ui_assets(pinned_source, tmp_path / "ui", str(bare))
    assert webui.why_no_webui(log) == "npm not found, skipping npm build"


@pytest.mark.slow
def test_an_unreachable_npm_registry_is_named_as_the_reason(pinned_source, tmp_path):
    if shutil.which("npm") is None:
        pytest.skip("no npm on PATH")
    log = _ui_assets(
        pinned_source,
        tmp_path / "ui",
        os.environ["PATH"],
        npm_config_registry=f"http://127.0.0.1:{free_port()}/",
        npm_config_fetch_retries="0",
        npm_config_cache=str(tmp_path / "npm-cache"),
    )
    reason = webui.why_no_webui(log)
    assert reason.startswith("npm ci failed")
    assert "ECONNREFUSED" in reason


def test_served_url_only_for_an_engine_with_the_ui(tmp_path):
    server = tmp_path / "llama-server"
    server.write_bytes(b"\x7fELF" + b"\0" * 64)
    assert webui.served_url(str(server), "127.0.0.1", 8080) is None
    server.write_bytes(b"\x7fELF" + b"\0" * 64 + webui.ASSET_MARKER)
    assert webui.served_url(str(server), "127.0.0.1", 8080) == "http://127.0.0.1:8080/"


def test_the_page_is_installed_beside_the_binaries_and_found_there(tmp_path, built_engine_home):
    """The suite's real build: its UI (in the build folder, for an install made before the
    page was copied) is copied beside the binaries, found there once the build folder is not."""
    paths = resolve_paths({"LUCEBOX_HOME": str(built_engine_home)})
    engine = next(e for e in list_engines(paths) if e.kind == "llama-server")
    built = uibundle.bundle_folder(paths, engine)
    assert built is not None and (built / "index.html").is_file()
    folder = tmp_path / "engine"
    install._install_ui(built, folder / uibundle.UI_FOLDER)
    moved = replace(engine, server_path=str(folder / "bin" / "llama-server"), build_key=None)
    assert uibundle.bundle_folder(paths, moved) == folder / "ui"
    install._install_ui(tmp_path / "no-ui", tmp_path / "other")  # a build without the UI
    assert not (tmp_path / "other").exists()
