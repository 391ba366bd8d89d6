"""The web UI build outside an engine build: the source's own UI script, machines without node.

The UI script (``scripts/ui-assets.cmake``) is what the engine build runs for the
``llama-ui-assets`` target; tests and the UI benchmark run it alone, as the build does.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from support.ports import free_port


def old_node_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PATH holds nothing but a node 18, the node of Debian 12 and Ubuntu 24.04.

    The real node on this machine is new enough, so the old one is a script that answers
    ``--version`` as node 18 does.
    """
    folder = tmp_path / "old-bin"
    folder.mkdir()
    node = folder / "node"
    node.write_text("#!/bin/sh\necho v18.19.1\n", encoding="utf-8")
    node.chmod(0o755)
    monkeypatch.setenv("PATH", str(folder))


def pip_cannot_reach_an_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip finds no package: its index is a closed port and no config or cache helps."""
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{free_port()}/simple")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "5")


def ui_assets_argv(source: Path, binary_dir: Path) -> list[str]:
    """The engine build's UI step for the pinned ``source``, writing into ``binary_dir``."""
    cmake = shutil.which("cmake")
    assert cmake is not None, "cmake is not on PATH"
    return [
        cmake,
        f"-DUI_SOURCE_DIR={source / 'tools' / 'ui'}",
        f"-DUI_BINARY_DIR={binary_dir}",
        f"-DLLAMA_SOURCE_DIR={source}",
        "-DLLAMA_BUILD_NUMBER=11434",
        "-DHF_BUCKET=ggml-org/llama-ui",
        "-DHF_VERSION=b11434",
        "-DHF_ENABLED=OFF",
        "-DBUILD_UI=ON",
        "-DLLAMA_UI_GZIP=ON",
        "-P",
        str(source / "scripts" / "ui-assets.cmake"),
    ]
