"""Machines without a usable node for the web UI build: an old node only, pip offline."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ports import free_port


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
