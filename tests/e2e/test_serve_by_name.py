"""`lucebox serve --model OWNER/REPO` end to end: the repo listed on a local Hub, its quant
chosen, the file pulled at the pinned commit with its sha256 checked, then served by the real
CPU engine (SmolLM2-135M-Instruct, the real model from PyPI) and answering a chat."""

from __future__ import annotations

import os

import httpx
import pytest

from lucebox.engine.bench.compare import ServeConfig, serving
from lucebox.engine.core.paths import resolve_paths
from lucebox.engine.models.records import files_dir, list_models
from lucebox.engine.pipeline import ServeOptions
from support.hubserver import COMMIT, HubFile, HubState, serve_hub
from support.realmodels import smol_model
from support.smolserver import private_engine_home

pytestmark = pytest.mark.slow
REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"


def test_a_repo_by_name_is_pulled_pinned_and_served(built_engine_home, tmp_path, monkeypatch):
    home = private_engine_home(tmp_path / "home")
    state = HubState()
    state.add(REPO, "SmolLM2-135M-Instruct-Q4_1.gguf", HubFile(smol_model().read_bytes()))
    state.add(REPO, "mmproj-SmolLM2-F16.gguf", HubFile(b"GGUF" + b"\0" * 60))
    paths = resolve_paths({"LUCEBOX_HOME": str(home)})
    with serve_hub(state) as hub:
        # Read inside: the local Hub lifts the suite's HF_HUB_OFFLINE while it serves.
        env = {**os.environ, "LUCEBOX_HOME": str(home), "HF_HOME": str(tmp_path / "hf")}
        env["HF_ENDPOINT"] = hub.base_url
        options = ServeOptions(model=f"hf.co/{REPO}:Q4_1", ctx=2048)
        with serving(paths, options, ServeConfig("by-name"), env=env, ready_timeout_s=600) as up:
            reply = httpx.post(
                f"{up.url}/v1/chat/completions",
                timeout=120,
                json={"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8},
            ).json()
            assert reply["usage"]["completion_tokens"] > 0
        # Its header is read and is no projector's: never pulled.
        assert hub.bytes_served.get((REPO, "mmproj-SmolLM2-F16.gguf"), 0) <= 64
    assert not list(files_dir(paths).rglob("mmproj*"))
    (record,) = list_models(paths)
    assert record.source == f"hf:{REPO}/SmolLM2-135M-Instruct-Q4_1.gguf@{COMMIT}"
    assert record.revision == COMMIT and record.sha256_source == "hub-lfs"
    assert record.files[0].sha256 == state.files[(REPO, "SmolLM2-135M-Instruct-Q4_1.gguf")].sha256
